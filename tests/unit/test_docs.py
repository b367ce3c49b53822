"""The README and docs/ stay a newcomer's read: the README fits (200 lines), every link resolves,
every page is reachable from the index, and what the pages state about the code and the figures
agrees with the code and with scripts/bench/RESULTS.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.cli import commands as cli
from launcher.worker import allreduce

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# Pages other branches write (spare nodes, restart policy, the store, torchrun flags, GPUs): linked
# already; checked like the rest once they are there. Empty this set once all have landed.
PENDING: set[str] = set()  # pages linked before they land (none now)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def test_the_readme_fits_a_first_read():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "source .venv/bin/activate" in text and ".venv/bin/python -m launcher" in text  # which Python
    for command in ("bash scripts/setup.sh", "bash scripts/test.sh", "bash scripts/demo.sh"):
        assert command in text
    assert not re.search(r"\d[\d,]* tests\b", text), "a test count goes stale: say none"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if dest.parent == DOCS and dest.name in PENDING and not dest.exists():
            continue
        assert dest.exists(), f"{page.name}: {target} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: {target}: no such heading"


def test_every_docs_page_is_in_the_index_and_the_index_in_the_readme():
    index = (DOCS / "index.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(index)}
    assert {p.name for p in DOCS.glob("*.md")} - {"index.md"} <= linked
    assert PENDING <= linked
    assert "docs/index.md" in README.read_text()


def figures_table() -> str:
    text = README.read_text()
    return text[text.index("## Measured against torchrun") :].split("\n## ")[0]


def test_the_readme_figures_are_the_benchmarks_and_stated_once():
    results = (ROOT / "scripts" / "bench" / "RESULTS.md").read_text()
    figures = re.findall(r"\d+\.\d+ (?:s|MiB)\b", figures_table())
    assert len(figures) >= 10
    for figure in figures:
        assert figure.split()[0] in results, f"{figure} is not in scripts/bench/RESULTS.md"
        for page in DOCS.glob("*.md"):
            assert figure not in page.read_text(), f"{figure} is stated again in docs/{page.name}"


def test_the_faults_table_is_one_table():
    lines = (DOCS / "faults.md").read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith("|")]
    assert rows == list(range(rows[0], rows[-1] + 1)), "a blank line cuts the table"


def test_the_bench_defaults_are_the_tools():
    p = allreduce.parser()
    size = allreduce.human(p.get_default("minbytes"))
    assert p.get_default("maxbytes") == p.get_default("minbytes")
    text = " ".join((DOCS / "examples.md").read_text().split())
    assert f"(both default to {size}: one size;" in text
    assert f"`-w` warm-up (default {p.get_default('warmup_iters')})" in text
    assert f"`-n` timed iterations (default {p.get_default('iters')})" in text


def test_the_summary_docs_say_when_there_is_no_error_line():
    text = " ".join((DOCS / "supervision.md").read_text().split())
    assert "its summary has no `error:` line" in text and "as with torchrun" in text


# -- every command the README shows parses (issue 34)

SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
# How a command begins -> its entry point: `python -m launcher.launch` is torch.distributed.launch's
ENTRIES = {
    "python -m launcher.launch": "launcher.launch",
    "python -m launcher": "launcher",
    ".venv/bin/python -m launcher": "launcher",
    "launcher": "launcher",
}


def shown_commands(text: str) -> list[tuple[str, ...]]:
    """The launcher commands in `text`'s code blocks and code spans, each once, as (entry point,
    *arguments), placeholders (`...`, `EVENTS…`) dropped."""
    import shlex

    found: list[str] = []
    for block in FENCE.findall(text):
        found += block.replace("\\\n", " ").splitlines()
    found += SPAN.findall(FENCE.sub("", text))
    commands: list[tuple[str, ...]] = []
    for line in found:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # output shown in a block ("the workers' start"): not a command, unless it reads as one
            assert not line.lstrip().startswith(tuple(ENTRIES)) or line.lstrip().startswith("launcher:"), line
            continue
        start = next((s for s in ENTRIES if words[: len(s.split())] == s.split()), None)
        if start is None:
            continue
        args = tuple(w for w in words[len(start.split()) :] if not w.endswith(("...", "…")))
        if (ENTRIES[start], *args) not in commands:
            commands.append((ENTRIES[start], *args))
    return commands


def with_help(args: list[str]) -> list[str]:
    """`args` with `--help` after the subcommand's words, before anything that must parse."""
    at = 2 if args[:2] == ["bench", "allreduce"] else 1 if args[:1] and args[0] in (*cli.SUBCOMMANDS, "check") else 0
    return [*args[:at], "--help", *args[at:]]


def test_the_readme_shows_its_commands():
    shown = shown_commands(README.read_text())
    assert ("launcher", "--nproc_per_node", "4", "train.py", "--lr", "0.1") in shown
    assert ("launcher", "status", "--rdzv_endpoint", "n0:29400", "--rdzv_id", "job42") in shown
    assert ("launcher.launch", "--nproc_per_node", "2", "old.py") in shown
    assert ("launcher", "bench", "allreduce") in shown and ("launcher", "check") in shown
    assert len(shown) >= 12, shown


@pytest.mark.parametrize("command", shown_commands(README.read_text()), ids=" ".join)
def test_every_command_the_readme_shows_parses(command, capsys):
    """Its options are the launcher's (a renamed or dropped flag fails here): `--help` of it succeeds."""
    entry, *args = command
    with pytest.raises(SystemExit) as done:
        # launcher.launch parses with the same command (launch.main would also set its default_map on
        # the shared command object, for the rest of this process)
        cli.main(with_help(args), prog_name=entry)
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    assert "usage" in out.lower() and err == "", (out, err)


def test_a_flag_the_launcher_lacks_fails_the_check(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(with_help(["--nproc_per_nodes", "4", "train.py"]))
    assert done.value.code == 2 and "No such option" in capsys.readouterr().err
