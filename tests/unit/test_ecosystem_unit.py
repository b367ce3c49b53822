"""Issue 34, in process: the distribution's own name in every install hint, prometheus_client a plain
dependency, every missing dependency named at once, near `--rdzv_conf` suggestions only, `-h`, and
no goodput line for the launcher's own tools."""

from __future__ import annotations

import configparser
import importlib.metadata
import re
import sys

import pytest
from support.paths import ROOT

from launcher import config as cfg
from launcher import install
from launcher.cli import commands as cli
from launcher.cli import deps

SETUP = configparser.ConfigParser()
SETUP.read(ROOT / "setup.cfg")
# `pip install 'NAME[extra]'` or `pip install -e '.[extra]'` as the hints and pages write it
HINT = re.compile(r"pip install\s+(?:-e\s+)?'?([A-Za-z0-9_.-]+)\[([a-z0-9,-]+)\]")


def hint_files() -> list:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]
    files += [*(ROOT / "launcher").rglob("*.py"), *(ROOT / "scripts").rglob("*.sh"), *(ROOT / "scripts").rglob("*.py")]
    return files


def test_the_distribution_has_a_name_of_its_own_and_every_hint_uses_it():
    # `launcher` on the package index is another project: a hint naming it installs a stranger's code
    assert SETUP["metadata"]["name"] == deps.DISTRIBUTION == "torch-launcher"
    extras = set(SETUP["options.extras_require"])
    seen = 0
    for path in hint_files():
        for name, wanted in HINT.findall(path.read_text()):
            seen += 1
            where = f"{path.relative_to(ROOT)}: pip install '{name}[{wanted}]'"
            assert name == deps.DISTRIBUTION or name == ".", where  # `-e '.[bench]'` in a checkout
            assert set(wanted.split(",")) <= extras, where
    assert seen >= 5
    assert deps.DISTRIBUTION in deps.fix_hint() or ".venv" in deps.fix_hint() or "setup.sh" in deps.fix_hint()


def test_an_install_hint_works_where_the_launcher_runs_from(monkeypatch, tmp_path):
    """From a checkout the extra comes from it (the name is not on the index until it is published);
    installed from the index, the index's name."""
    pip = f"{sys.executable} -m pip install"
    monkeypatch.chdir(ROOT)
    assert install.command("gpu") == f"{pip} -e '.[gpu]'" and install.command() == f"{pip} -e ."
    monkeypatch.setattr(install, "CHECKOUT", str(tmp_path))  # no setup.cfg beside the package: not a checkout
    assert install.command("etcd-grpc") == f"{pip} 'torch-launcher[etcd-grpc]'"
    assert install.command() == f"{pip} torch-launcher"


def test_prometheus_client_is_a_plain_dependency():
    """--metrics_port works after `bash scripts/setup.sh`: no extra to know of."""
    plain = [r.split("#")[0].strip() for r in SETUP["options"]["install_requires"].splitlines()]
    assert any(r.startswith("prometheus_client") for r in plain)
    assert "metrics" not in SETUP["options.extras_require"]
    installed = importlib.metadata.requires(deps.DISTRIBUTION) or []
    assert any(r.startswith("prometheus_client") and "extra" not in r for r in installed), installed
    assert deps.METRICS_NEED == ("prometheus_client",)


def test_an_interpreter_without_the_cli_names_every_missing_dependency(monkeypatch):
    # None in sys.modules: what find_spec reports for a module this interpreter cannot import
    for name in ("psutil", "torch"):
        monkeypatch.setitem(sys.modules, name, None)
    line = deps.before_cli("psutil")
    assert line.startswith(f"psutil and torch are not installed for {sys.executable}; "), line
    monkeypatch.delitem(sys.modules, "psutil")
    monkeypatch.delitem(sys.modules, "torch")
    assert deps.before_cli("click").startswith("click is not installed")  # whatever failed first, at least


def test_metrics_port_is_refused_in_one_line_where_prometheus_client_is_missing(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(SystemExit) as done:
        cli.main(["--metrics_port", "0", str(script)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    assert "prometheus_client is not installed for " in err and "pip install 'launcher" not in err, err


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("join_timout", " (did you mean join_timeout?)"),
        ("foo", ""),
        ("heartbeat", ""),
        ("is-host", " (did you mean is_host?)"),
    ],
)
def test_an_unknown_rdzv_conf_key_gets_a_suggestion_only_when_one_is_near(key, hint):
    c = cfg.from_flags(
        nnodes="2", rdzv_backend="c10d", rdzv_endpoint="h:1", rdzv_conf=f"{key}=1",
        training_script="true", no_python=True, environ={},
    )  # fmt: skip
    assert c.notes == (f"--rdzv_conf {key} is not a c10d rendezvous setting; ignored{hint}",)


def test_dash_h_prints_the_usage_and_after_the_script_is_the_scripts(capsys):
    # a fresh command object, as in a new process: click keeps the help option its first context made
    command = cli.command
    fresh = type(command)(
        command.name, context_settings=dict(command.context_settings), callback=command.callback,
        params=list(command.params), epilog=command.epilog, help=command.help,
    )  # fmt: skip
    args = cli.expand_prefixes(fresh, ["-h"])
    with pytest.raises(SystemExit) as done:
        fresh.main(args=args, prog_name="launcher")
    assert done.value.code == 0 and capsys.readouterr().out.startswith("Usage: launcher [OPTIONS]")
    ctx = fresh.make_context("launcher", cli.expand_prefixes(fresh, ["--nproc_per_node", "2", "train.py", "-h"]))
    assert ctx.params["training_script"] == "train.py" and ctx.params["training_script_args"] == ("-h",)


def test_the_launchers_own_tools_end_without_a_goodput_line():
    assert set(cli.WORKLOADS.values()) == cfg.TOOL_MODULES
    _, check = cli.workload(["check", "--nproc_per_node", "2"])
    flags = dict(training_script=check[-1], module=True, nproc_per_node="2", environ={})
    assert not cfg.from_flags(**flags).trains
    assert cfg.from_flags(**{**flags, "training_script": "json.tool"}).trains
