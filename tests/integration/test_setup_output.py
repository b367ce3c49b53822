"""scripts/setup.sh says one line while it installs and nothing else, unless pip fails: then pip's
whole output. Run on a copy of the packaging files with a .venv whose pip is a shell script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIP_NOISE = "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file nor a directory."


def checkout(tmp_path: Path, pip_fails: bool) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("scripts/setup.sh", "setup.cfg", "pyproject.toml"):
        (repo / name).write_text((ROOT / name).read_text())
    bin_ = repo / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text("#!/bin/sh\nexit 0\n")  # "torch is there": only the launcher is installed
    (bin_ / "pip").write_text(f'#!/bin/sh\necho "{PIP_NOISE}" >&2\necho "pip $*"\nexit {1 if pip_fails else 0}\n')
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    return repo


def setup(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHON="false"),
    )


def test_setup_is_one_line_when_pip_succeeds_and_silent_the_second_time(tmp_path):
    repo = checkout(tmp_path, pip_fails=False)
    first = setup(repo)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "" and first.stderr.count("\n") == 1 and first.stderr.startswith("setup: installing")
    again = setup(repo)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


def test_setup_shows_pips_whole_output_when_pip_fails(tmp_path):
    r = setup(checkout(tmp_path, pip_fails=True))
    assert r.returncode == 1
    assert PIP_NOISE in r.stderr and "pip install" in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("-e .") and "setup: failed: .venv/bin/pip install" in r.stderr, r.stderr
