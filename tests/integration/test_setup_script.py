"""scripts/setup.sh in a fake checkout (a .venv whose python and pip only log their calls): an
unchanged checkout is not installed again; changed packaging or a stale venv is. And the interpreter
it makes .venv with (scripts/pick_python.sh), picked among this host's real ones."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from support.paths import ROOT


def fake_checkout(tmp_path):
    """A copy of the scripts and packaging files, with a .venv whose python and pip only log their calls."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("scripts/setup.sh", "setup.cfg", "pyproject.toml"):
        (repo / name).write_text((ROOT / name).read_text())
    (repo / ".venv" / "bin").mkdir(parents=True)
    for tool in ("python", "pip"):
        shim = repo / ".venv" / "bin" / tool
        shim.write_text(f'#!/bin/sh\necho "{tool} $*" >> "$(dirname "$0")/../calls"\n')
        shim.chmod(0o755)
    return repo


def setup_calls(repo, *args) -> list[str]:
    calls = repo / ".venv" / "calls"
    calls.unlink(missing_ok=True)
    subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh"), *args],
        check=True,
        timeout=30,
        capture_output=True,
        env=dict(os.environ, PYTHON="false"),
    )
    return calls.read_text().splitlines() if calls.exists() else []


def test_setup_skips_reinstalling_an_unchanged_checkout(tmp_path):
    repo = fake_checkout(tmp_path)
    installs = [c for c in setup_calls(repo) if c.startswith("pip install") and c.endswith("-e .")]
    assert installs and "editable_mode=compat" in installs[0]  # a fresh clone installs, with no import hook
    assert setup_calls(repo) == []  # the second run (demo.sh's) starts at once
    with open(repo / "setup.cfg", "a") as f:
        f.write("\n# a new dependency\n")
    assert any(c.startswith("pip install") for c in setup_calls(repo))  # packaging changed: install again
    assert setup_calls(repo) == []
    (repo / ".venv" / ".launcher-installed").write_text("stale\n")  # e.g. a venv of another checkout
    assert any(c.startswith("pip install") for c in setup_calls(repo))


def test_a_venv_from_before_the_rename_loses_the_old_distribution(tmp_path):
    """The distribution was `launcher` (another project's name on the index), now torch-launcher: the old
    editable install is removed first, or it would stay beside the new one, a second `launcher` command."""
    repo = fake_checkout(tmp_path)
    (repo / ".venv" / "lib" / "python3.11" / "site-packages" / "launcher-0.1.0.dist-info").mkdir(parents=True)
    (repo / "launcher.egg-info").mkdir()
    calls = [c for c in setup_calls(repo) if c.startswith("pip ")]
    assert calls[0].startswith("pip uninstall") and calls[0].endswith(" launcher"), calls
    assert calls[1].startswith("pip install") and calls[1].endswith("-e ."), calls
    assert not (repo / "launcher.egg-info").exists()
    assert setup_calls(repo) == []  # the stamp: nothing again


PROBE = (
    "import sys, ensurepip, venv; "
    'print("%d.%d" % sys.version_info[:2], any("libpython" in l for l in open("/proc/self/maps")))'
)
OTHERS = ("/usr/bin/python3", "/usr/local/bin/python3")  # where pick_python.sh looks besides PATH's python3


def built(python: str) -> tuple[str, bool] | None:
    """(the interpreter's version, whether it runs on a shared libpython); None if it cannot make a venv."""
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return None
    version, shared = out.stdout.split()
    return version, shared == "True"


def pick(path: str) -> subprocess.CompletedProcess:
    script = str(ROOT / "scripts" / "pick_python.sh")
    return subprocess.run(["bash", script], capture_output=True, text=True, timeout=60, env=dict(os.environ, PATH=path))


def test_the_venv_gets_python3s_version_on_a_shared_libpython_only_where_no_other_build_of_it_is_here():
    first_path = shutil.which("python3")
    if first_path is None:
        pytest.skip("no python3 on PATH")
    first, r = built(first_path), pick(os.environ["PATH"])
    chosen = r.stdout.strip()
    if chosen == "python3":
        others = [c for c in OTHERS if os.access(c, os.X_OK) and c != first_path]
        assert first is None or not first[1] or all(built(c) != (first[0], False) for c in others)
        assert r.stderr == ""
    else:  # another build of the same version, without the shared library: said in one line
        assert first is not None and first[1] and built(chosen) == (first[0], False), chosen
        assert r.stderr.count("\n") == 1 and f"making .venv with {chosen}" in r.stderr, r.stderr


def test_a_python3_that_runs_without_a_shared_libpython_is_kept_silently(tmp_path):
    static = next((c for c in OTHERS if os.access(c, os.X_OK) and (b := built(c)) and not b[1]), None)
    if static is None:
        pytest.skip("no python3 here makes a venv without a shared libpython")
    (tmp_path / "python3").symlink_to(static)
    r = pick(f"{tmp_path}:/usr/bin:/bin")
    assert (r.stdout.strip(), r.stderr) == ("python3", "")
