"""scripts/setup.sh in a fake checkout (a .venv whose python and pip only log their calls): an
unchanged checkout is not installed again; changed packaging or a stale venv is."""

from __future__ import annotations

import os
import subprocess

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
    assert any(c.startswith("pip install") and c.endswith("-e .") for c in setup_calls(repo))  # a fresh clone installs
    assert setup_calls(repo) == []  # the second run (demo.sh's) starts at once
    with open(repo / "setup.cfg", "a") as f:
        f.write("\n# a new dependency\n")
    assert any(c.startswith("pip install") for c in setup_calls(repo))  # packaging changed: install again
    assert setup_calls(repo) == []
    (repo / ".venv" / ".launcher-installed").write_text("stale\n")  # e.g. a venv of another checkout
    assert any(c.startswith("pip install") for c in setup_calls(repo))
