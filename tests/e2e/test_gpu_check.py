"""scripts/gpu_check.sh in CPU mode (CUDA hidden): every GPU item SKIPs with its reason, the CPU items
pass, exit 0; and a failing item makes the exit status non-zero.

Of the CPU items the suite runs the two that exercise the script's own logic (train_ddp and
check_train, shared with the NCCL items, on the zygote's path; and the NUMA item's no-GPU line). The
others run commands other tests run already (test_examples: train_ddp.py spawned and collectives.py;
test_workloads: `check` and `bench allreduce`), each a torch job of its own (~50 s of CPU in all)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CPU_ITEMS = {
    "train_ddp_gloo",
    "train_ddp_gloo_preload",
    "collectives_gloo",
    "check_cpu",
    "bench_allreduce_cpu",
    "numa_binding_no_gpu",
}
GPU_ITEMS = {
    "train_ddp_nccl",
    "train_ddp_nccl_preload",
    "collectives_nccl",
    "check_nccl",
    "bench_allreduce",
    "gpus_flag",
    "nproc_gpu",
    "virtual_local_rank",
    "numa_binding",
    "nvml_health",
    "in_place_nccl",
}
RUN_CPU_ITEMS = {"train_ddp_gloo_preload", "numa_binding_no_gpu"}
LINE = re.compile(r"^(PASS|FAIL|SKIP)  (\S+) +(.+)$")


def gpu_check(logs: Path, timeout: float, **extra: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "GPU_CHECK_"))}
    env.update(PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", GPU_CHECK_LOGS=str(logs), **extra)
    p = subprocess.Popen(
        ["bash", str(SCRIPT)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"gpu_check.sh still running after {timeout:g} s:\n{out}")
    items = {m[2]: (m[1], m[3]) for m in map(LINE.match, out.splitlines()) if m}
    return p.returncode, items, out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_without_cuda_every_gpu_item_skips_and_the_cpu_items_pass(tmp_path):
    rc, items, out = gpu_check(tmp_path / "logs", 840, GPU_CHECK_ONLY=",".join(sorted(GPU_ITEMS | RUN_CPU_ITEMS)))
    assert set(items) == GPU_ITEMS | RUN_CPU_ITEMS, out
    for name in GPU_ITEMS:
        verdict, reason = items[name]
        assert verdict == "SKIP" and reason.strip(), out
    assert items["train_ddp_nccl"][1].startswith("no GPU: "), out
    nvidia = "/proc/driver/nvidia/gpus"
    has_gpus = os.path.isdir(nvidia) and bool(os.listdir(nvidia))  # then the no-GPU NUMA item has nothing to show
    for name in RUN_CPU_ITEMS:
        assert items[name][0] == ("SKIP" if has_gpus and name == "numa_binding_no_gpu" else "PASS"), out
    assert rc == 0, out
    assert re.search(rf"gpu_check: \d+ passed, 0 failed, {len(GPU_ITEMS)} skipped; logs in ", out), out
    assert (tmp_path / "logs" / "train_ddp_gloo_preload.log").exists()


def test_the_script_has_exactly_the_items_named_here():
    """Every item the script can run, CPU or GPU, is one this file knows (the full run is on a GPU machine)."""
    assert set(re.findall(r"^if wanted (\w+)", SCRIPT.read_text(), re.M)) == CPU_ITEMS | GPU_ITEMS
    assert RUN_CPU_ITEMS <= CPU_ITEMS


def test_a_failing_item_fails_the_script_with_its_reason(tmp_path):
    rc, items, out = gpu_check(tmp_path / "logs", 100, GPU_CHECK_ONLY="collectives_gloo", GPU_CHECK_TIMEOUT="1")
    assert rc == 1, out
    assert list(items) == ["collectives_gloo"] and items["collectives_gloo"][0] == "FAIL", out
    assert items["collectives_gloo"][1].startswith("exit 124"), out  # timeout(1)'s status for a stopped item
