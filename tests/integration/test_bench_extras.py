"""A benchmark that needs an extra says so at once, with the command (issue 34): rendezvous_scale.py
without greenlet waited two minutes for runners that had died on the import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import ROOT

pytestmark = pytest.mark.timeout(60)
BENCH = ROOT / "scripts" / "bench"
# The interpreter the venv of scripts/setup.sh is, as far as greenlet goes: it cannot import it
WITHOUT_GREENLET = "import runpy, sys; sys.modules['greenlet'] = None; sys.argv = sys.argv[1:]; " \
    "sys.path.insert(0, {bench!r}); runpy.run_path(sys.argv[0], run_name='__main__')"  # fmt: skip


@pytest.mark.parametrize(
    ("script", "args", "env", "other"),
    [
        ("rendezvous_scale.py", ["--ours", "4", "--torch", "", "--host-net"], {}, "BENCH_HARNESS=threads"),
        ("bootstrap_store.py", ["--ranks", "4", "--host-net"], {}, "--harness threads"),
    ],
)
def test_a_missing_extra_is_one_line_with_the_command_at_once(script, args, env, other):
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_GREENLET.format(bench=str(BENCH)), str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == "", r.stderr
    assert r.stderr.startswith(f"{script}: needs greenlet for "), r.stderr
    assert "-m pip install -e '.[bench]'" in r.stderr and other in r.stderr, r.stderr
