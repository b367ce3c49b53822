"""--numa_binding through the launcher: the CPUs land in spawned and in forked (--preload) workers.

The agent reads a fake machine (launcher.agent.numa.SYSFS_ROOT) whose CPUs are this host's own, two
GPUs on one NUMA node of two cores: `exclusive` gives each worker one core, which the worker reads
back with sched_getaffinity before it does anything else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = sorted(os.sched_getaffinity(0))

# The launcher as `python -m launcher` runs it, with the machine read from argv[1].
AGENT = """
import atexit, sys
import launcher.agent.numa
launcher.agent.numa.SYSFS_ROOT = sys.argv[1]
atexit.register(lambda: print(f"agent imported torch: {'torch' in sys.modules}", file=sys.stderr))
from launcher.cli.commands import main
main(sys.argv[2:])
"""

WORKER = """
import os
forked = "launcher.agent.zygote" in open("/proc/self/cmdline").read()
print(f"cpus={sorted(os.sched_getaffinity(0))} forked={forked}", flush=True)
"""


def fake_machine(root: Path, cpus: list[int]) -> Path:
    """One NUMA node of `cpus` (one core each, one cache), two NVIDIA GPUs on it."""

    def write(path: str, text: str) -> None:
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    write("sys/devices/system/node/possible", "0")
    write("sys/devices/system/node/node0/cpulist", ",".join(map(str, cpus)))
    for cpu in cpus:
        write(f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", "0")
        write(f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", str(cpu))
    for pci in ("0000:1b:00.0", "0000:29:00.0"):
        write(f"sys/bus/pci/devices/{pci}/vendor", "0x10de")
        write(f"sys/bus/pci/devices/{pci}/class", "0x030200")
        write(f"sys/bus/pci/devices/{pci}/numa_node", "0")
    return root


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "CUDA_"))}
    env["PYTHONPATH"] = str(ROOT)
    machine = fake_machine(tmp_path / "machine", ALLOWED[:2])
    p = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(machine), *args, "worker.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the launcher did not finish within 100 s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs to tell one worker's core from the other's")
@pytest.mark.parametrize("preload", [False, True], ids=["spawned", "forked"])
def test_each_worker_runs_on_its_share_of_the_gpus_node(tmp_path, preload):
    flags = ["--preload"] if preload else []
    r = launch(tmp_path, "--nproc_per_node", "2", "--numa_binding", "exclusive", *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = ALLOWED[:2]
    assert f"[rank0]: cpus=[{a}] forked={preload}" in r.stdout, r.stdout + r.stderr[-2000:]
    assert f"[rank1]: cpus=[{b}] forked={preload}" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "numa_binding" not in r.stderr  # nothing to warn about
    assert "agent imported torch: False" in r.stderr


def test_a_machine_without_a_gpu_says_so_in_one_line_and_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-c", AGENT, str(tmp_path / "empty"), "--numa_binding", "node", "worker.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    told = [line for line in r.stderr.splitlines() if "numa_binding" in line]
    assert len(told) == 1 and told[0].endswith(
        "--numa_binding node: no NVIDIA GPU on this machine; the workers run unbound"
    )
    assert f"cpus={ALLOWED} forked=False" in r.stdout


def test_a_mode_torch_does_not_have_is_one_line_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["PYTHONPATH"] = str(ROOT)
    (tmp_path / "worker.py").write_text(WORKER)
    r = subprocess.run(
        [sys.executable, "-m", "launcher", "--numa-binding", "cores", "worker.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "launcher: error: --numa_binding 'cores' is not a mode; use one of node, socket, exclusive, core-complex"
    ]
