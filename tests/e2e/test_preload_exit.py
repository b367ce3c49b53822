"""--preload: a forked worker's interpreter shuts down as a spawned one does.

The zygote freezes what it preloaded (gc.freeze: fewer pages copied on write). Frozen objects are
never collected, not even at shutdown, so cyclic garbage from the preload was never finalised in a
forked worker: with torch 2.15 each worker printed ~30 `nanobind: leaked N instances` lines (triton's
extension checks its objects at exit). A preloaded module holding a cycle with a `__del__` shows it
without triton: its finaliser must run at exit in a forked worker as it does in a spawned one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CYCLE_MODULE = """
import os


class Cycle:
    def __del__(self, write=os.write):
        write(1, b"finalised at exit\\n")


held = Cycle()
held.me = held  # only the collector frees it, once the interpreter clears this module at exit
"""


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "cyclemod.py").write_text(CYCLE_MODULE)
    (tmp_path / "job.py").write_text(
        "import cyclemod  # noqa: F401\n"
        "forked = 'launcher.agent.zygote' in open('/proc/self/cmdline').read()\n"
        "print(f'worker ran forked={forked}', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    p = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--nproc_per_node", "1", *flags, "job.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the launcher did not finish within 90 s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize("flags", [(), ("--preload_modules", "cyclemod")], ids=["spawned", "forked"])
def test_preloaded_cycles_are_finalised_at_exit(tmp_path, flags):
    r = _run(tmp_path, *flags)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"[rank0]: worker ran forked={bool(flags)}" in r.stdout, r.stdout
    assert "[rank0]: finalised at exit" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "Exception ignored" not in r.stdout + r.stderr
