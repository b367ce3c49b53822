"""A newcomer's rough edges (issue 25), in-process: the fix a missing dependency names, the typo
suggestion, torch's traceback prefix under ours, and `launcher status` right after a round formed."""

from __future__ import annotations

import io
import os
import sys

from rich.console import Console

from launcher.agent.logs import LogRouter
from launcher.cli import deps
from launcher.cli.commands import closest_first
from launcher.cli.view import render_status


def test_a_missing_module_is_named_with_the_fix_in_one_line():
    assert deps.missing(("os", "no_such_module_for_the_launcher")) == ["no_such_module_for_the_launcher"]
    line = deps.problem(["psutil", "torch"])
    assert "\n" not in line
    assert line.startswith(f"psutil and torch are not installed for {sys.executable}; ")
    venv = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(deps.__file__))), ".venv", "bin", "python")
    assert ("activate the venv: source " in line) if os.path.isfile(venv) else ("setup.sh" in line)
    assert deps.problem(["psutil", "rich", "torch"]).startswith("psutil, rich and torch are not")
    assert deps.problem(["click"]).startswith("click is not installed")


def test_a_transposed_option_is_suggested_before_a_merely_similar_one():
    # click's own list is alphabetical, so `--no_preload` came first for `--nproc_pre_node`
    offered = ["--no-preload", "--no_preload", "--nproc-per-node", "--nproc_per_node"]
    assert closest_first("--nproc_pre_node", offered) == ["--nproc_per_node", "--no_preload"]
    assert closest_first("--nproc-pre-node", offered) == ["--nproc-per-node", "--no-preload"]
    assert closest_first("--no", ["--nnodes", "--no_live"])[0] == "--no_live"  # an ambiguous prefix: what it begins


def lines_through_router(prefix: str, rank: int, text: bytes) -> str:
    r, w = os.pipe()
    console = io.BytesIO()
    router = LogRouter()
    try:
        with os.fdopen(r, "rb", buffering=0) as pipe:
            stream = router.add(pipe, prefix, console, None, rank=rank)
            os.write(w, text)
            os.close(w)
            router.drain([stream], timeout=5.0)
            return console.getvalue().decode()
    finally:
        router.close()


def test_torchs_own_rank_prefix_becomes_ours_instead_of_doubling():
    torch_hook = b"[rank1]: Traceback (most recent call last):\n\n[rank1]: RuntimeError: boom\nplain\n"
    assert lines_through_router("[vm rank1]: ", 1, torch_hook).splitlines() == [
        "[vm rank1]: Traceback (most recent call last):",
        "[vm rank1]: ",
        "[vm rank1]: RuntimeError: boom",
        "[vm rank1]: plain",
    ]
    # one node: the prefixes are the same, said once; another rank's prefix in the text is kept
    assert lines_through_router("[rank1]: ", 1, b"[rank1]: x\n[rank2]: y\n").splitlines() == [
        "[rank1]: x",
        "[rank1]: [rank2]: y",
    ]


def shown(job: dict) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(render_status(job))
    return console.file.getvalue()


def test_status_right_after_a_round_formed_says_what_it_waits_for():
    job = {"run_id": "job42", "round": 3, "restarts": 1, "nodes": [], "max_restarts": None, "stragglers": []}
    text = shown({**job, "state": "running"})
    assert "no node has published a snapshot" not in text
    assert "round 3 just formed: waiting for its nodes to start their workers and report" in text
    forming = shown({**job, "state": "forming", "forming": {"round": 4, "joined": 1}})
    assert "round 4 is forming (1 joined)" in forming
    assert "no such job in this store" in shown({**job, "state": "absent"})


def test_ctrl_c_before_the_supervisor_takes_the_signals_is_one_line_and_130(monkeypatch, capsys, tmp_path):
    """Outside run()'s own connect-phase handler, click would print an empty line and exit silently."""
    import launcher.cli.run
    from launcher.cli.commands import main

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher.cli.run, "run", interrupted)
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    try:
        main(["--nproc_per_node", "1", str(script)])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 130 and err == "launcher: got SIGINT; stopped\n", err
