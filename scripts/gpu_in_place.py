"""The in-place NCCL path on one GPU (world size 1, under a minute): what can run without a peer.

    .venv/bin/python scripts/gpu_in_place.py          # PASS/FAIL per item; exit 1 if any failed

1. regroup: a NCCL group on prefix 0 of a TCPStore, an all_reduce, the watcher's `abort.wake`
   from another thread, `abort.leave` on the main thread, a new group on prefix 1 of the same
   store in the same process, an all_reduce, a DDP step (init_sync=False) and `transfer.plan`.
2. launcher: `--recovery in-place --nproc_per_node 1` with examples/train_in_place.py on NCCL,
   the rank SIGKILLed in step 20: the replacement joins round 1 on NCCL and the job ends rc 0
   (at world size 1 no survivor holds the state: it starts again from step 0).
3. blocked: a NCCL group of world size 2 whose rank 1 never comes; the main thread's all_reduce
   blocks in the communicator's set-up; `abort.wake` from another thread after 2 s must make it
   return (an error) within 15 s (TORCH_NCCL_USE_COMM_NONBLOCKING=1, as torch needs for an abort
   of a communicator still forming).
   Seen on one H200 (torch 2.11): regroup and launcher PASS; blocked FAILs, the abort itself
   waited 60 s (ProcessGroupNCCL: "Future for ProcessGroup abort timed out after 60000 ms").
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from launcher.net import free_port  # noqa: E402
from launcher.worker.inplace import abort, transfer  # noqa: E402

results: list[tuple[str, bool, str]] = []


def item(name: str):
    def run(fn):
        began = time.monotonic()
        try:
            ok, why = fn()
        except Exception as e:  # an item that raises fails with its error, the others still run
            ok, why = False, f"{type(e).__name__}: {e}"
        results.append((name, ok, f"{why} ({time.monotonic() - began:.1f} s)"))
        print(f"{'PASS' if ok else 'FAIL'}  {name:10s} {results[-1][2]}", flush=True)
        return fn

    return run


def group(store, prefix: str, rank: int, world: int, timeout: float = 30.0) -> dist.ProcessGroup:
    wait = datetime.timedelta(seconds=timeout)
    dist.init_process_group("nccl", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world, timeout=wait)
    return dist.group.WORLD


if not torch.cuda.is_available():
    print("SKIP  every item: no CUDA device")
    sys.exit(0)
torch.cuda.set_device(0)
device = torch.device("cuda", 0)


@item("regroup")
def regroup():
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    pg = group(store, "launcher/inplace/0/pg", 0, 1)
    t = torch.ones(1 << 20, device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    began = time.monotonic()
    waker = threading.Thread(target=abort.wake, args=(pg, "nccl", ()))
    waker.start()
    waker.join(10)
    abort.leave(pg, "nccl")
    group(store, "launcher/inplace/1/pg", 0, 1)
    dist.all_reduce(t)
    model = torch.nn.Linear(64, 64).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, init_sync=False)
    ddp(torch.randn(8, 64, device=device)).sum().backward()
    plan = transfer.plan(True, 7, device)
    torch.cuda.synchronize()
    took = time.monotonic() - began
    dist.destroy_process_group()
    ok = t[0].item() == 1.0 and plan.to == () and not waker.is_alive()
    return ok, f"abort from a thread, destroy, new group on a new prefix, DDP step: {took:.2f} s"


@item("launcher")
def launcher_run():
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [sys.executable, "-m", "launcher", "--nproc_per_node", "1", "--recovery", "in-place"]
        cmd += ["--max_restarts", "1", "--events_file", str(events), str(ROOT / "examples" / "train_in_place.py")]
        cmd += ["--steps", "40", "--crash-at-step", "20", "--crash-rank", "0"]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=45, env=env)
        kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()] if events.exists() else []
        ok = r.returncode == 0 and "recovered" in kinds and kinds.count("spawn") == 2
        why = (
            f"rc {r.returncode}, events: {' '.join(k for k in kinds if k in ('spawn', 'recovered', 'in_place_failed'))}"
        )
        return ok, why if ok else why + "\n" + r.stderr[-1500:]


@item("blocked")
def blocked():
    store = dist.TCPStore(
        "127.0.0.1", free_port(), 2, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
    )
    pg = group(store, "launcher/inplace/0/pg", 0, 2, timeout=60)
    t = torch.ones(16, device=device)
    box: dict = {}

    def collective():
        began = time.monotonic()
        try:
            dist.all_reduce(t)
            torch.cuda.synchronize()
            box["how"] = "returned without an error"
        except Exception as e:
            box["how"] = f"raised {type(e).__name__}"
        box["at"] = time.monotonic() - began

    main = threading.Thread(target=collective, daemon=True)  # stands for the main thread, blocked
    main.start()
    time.sleep(2.0)
    abort.wake(pg, "nccl", ())
    main.join(15)
    if main.is_alive():
        return False, "the all_reduce still blocked 15 s after ProcessGroup.abort()"
    return "raised" in box["how"], f"the blocked all_reduce {box['how']} {box['at'] - 2.0:.2f} s after the abort"


failed = [name for name, ok, _ in results if not ok]
print(f"gpu_in_place: {len(results) - len(failed)} passed, {len(failed)} failed")
sys.stdout.flush()
os._exit(1 if failed else 0)  # a NCCL abort left running must not hold the interpreter's exit
