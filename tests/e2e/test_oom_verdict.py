"""SIGKILL is not always the OOM killer: a worker killed from outside is not called out of memory;
one the kernel killed in a memory cgroup of its own is."""

from __future__ import annotations

import os
import subprocess

import pytest
from support.paths import LAUNCHER, worker
from support.processes import wait_gone


def test_sigkill_from_outside_is_not_called_out_of_memory(launch):
    r = launch.run("--nproc_per_node", "2", worker("kill_self.py"))
    assert r.returncode == 1, r.stderr
    root = next(line for line in r.stderr.splitlines() if "root cause:" in line)
    assert "killed by SIGKILL" in root and "memory" not in root.lower(), root


def memory_cgroup_of_our_own():
    """A child cgroup v2 with the memory controller, under ours; None where none can be made."""
    try:
        ours = open("/proc/self/cgroup").read().split("0::", 1)[1].split("\n")[0]
    except (OSError, IndexError):
        return None
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        parent = mount + ours.rstrip("/")
        try:
            if "memory" not in open(parent + "/cgroup.subtree_control").read().split():
                continue
            child = f"{parent}/launcher-oom-{os.getpid()}"
            os.mkdir(child)
            return child
        except OSError:
            continue
    return None


OOM_WORKER = "import os, time\nif os.environ['RANK'] == '0':\n    b = bytearray(1 << 30)\ntime.sleep(30)\n"


@pytest.mark.timeout(60)
def test_a_real_oom_kill_is_called_out_of_memory(launch, tmp_path):
    child = memory_cgroup_of_our_own()
    if child is None:
        pytest.skip("no cgroup v2 with the memory controller delegated here to make a small one")
    try:
        open(f"{child}/memory.max", "w").write(str(200 << 20))
        open(f"{child}/memory.swap.max", "w").write("0")
        script = tmp_path / "hog.py"
        script.write_text(OOM_WORKER)
        r = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {child}/cgroup.procs && exec "$@"',
                "sh",
                *LAUNCHER,
                "--nproc_per_node",
                "2",
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=50,
            env=launch.env(),
        )
        root = next(line for line in r.stderr.splitlines() if "root cause:" in line)
        assert "killed by SIGKILL" in root and "out of memory" in root, r.stderr
    finally:
        assert wait_gone(launch.token) == []
        os.rmdir(child)
