"""What a worker's exit costs, spawned and forked (--preload), side by side; and whether it ever hangs.

Each run launches `tests/workers/ddp_free_model.py` (2 ranks, gloo: train, destroy the group, free the
model at the end of `main`), alternating spawned and forked. A rank's exit cost is the time from its
last line (`done <time>`, printed as its exit begins) to the agent seeing it exit (the events file).
`--busy K` runs K busy loops beside it. A run that does not end within 60 s is a hang; one whose rank
died of torch's teardown race ("terminate called without an active exception": gloo's thread meets
the interpreter's finalisation, pytorch#190489) is counted as an abort.

    .venv/bin/python scripts/bench/worker_exit.py --runs 20 --busy 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile

import benchlib

ROOT = os.path.dirname(os.path.dirname(benchlib.HERE))
WORKER = os.path.join(ROOT, "tests", "workers", "ddp_free_model.py")


ABORT = "terminate called without an active exception"


def one(preload: bool) -> list[float] | str:
    """The exit cost of each rank in one run, seconds ("hang" or "abort" when it did not end well)."""
    with tempfile.TemporaryDirectory() as tmp:
        events = os.path.join(tmp, "events.jsonl")
        flags = ["--preload"] if preload else []
        cmd = [benchlib.PY, "-m", "launcher", *flags, "--standalone", "--nproc_per_node", "2"]
        try:
            r = subprocess.run(
                [*cmd, "--events_file", events, WORKER], capture_output=True, text=True, timeout=60, cwd=ROOT
            )
        except subprocess.TimeoutExpired:
            return "hang"
        if r.returncode != 0 and ABORT in r.stdout + r.stderr:
            return "abort"
        if r.returncode != 0:
            raise SystemExit(f"run failed ({r.returncode}): {r.stderr[-1500:]}")
        done = {}
        for line in r.stdout.splitlines():
            if "]: done " in line:
                rank = int(line.split("]")[0].removeprefix("[rank"))
                done[rank] = float(line.rsplit(" ", 1)[1])
        with open(events) as f:
            exits = {e["rank"]: e["time"] for e in map(json.loads, f) if e["event"] == "exit"}
        return [exits[rank] - t for rank, t in done.items()]


def busy() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="runs of each kind")
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside the runs")
    ap.add_argument("--only", choices=["spawned", "forked"], help="one kind only (a hang count)")
    a = ap.parse_args()
    loops = [multiprocessing.Process(target=busy, daemon=True) for _ in range(a.busy)]
    for p in loops:
        p.start()
    kinds = [k for k in ("spawned", "forked") if a.only in (None, k)]
    costs: dict[str, list[float]] = {k: [] for k in kinds}
    bad = {k: {"hang": 0, "abort": 0} for k in kinds}
    try:
        for _ in range(a.runs):
            for kind in kinds:  # alternating: both meet the same load
                got = one(kind == "forked")
                if isinstance(got, str):
                    bad[kind][got] += 1
                else:
                    costs[kind].extend(got)
    finally:
        for p in loops:
            p.terminate()
    print(f"{benchlib.revision()}; {a.runs} runs of each, 2 ranks, {a.busy} busy loops beside")
    for kind in kinds:
        c = sorted(costs[kind])
        med = statistics.median(c) if c else float("nan")
        worst = max(c, default=float("nan"))
        print(
            f"{kind:8s} exit median {med:.3f} s  max {worst:.3f} s  hangs {bad[kind]['hang']}  aborts {bad[kind]['abort']}"
        )
    if len(kinds) == 2 and costs["spawned"] and costs["forked"]:
        diff = statistics.median(costs["forked"]) - statistics.median(costs["spawned"])
        print(f"forked - spawned: {diff:+.3f} s")
    sys.exit(1 if any(b["hang"] for b in bad.values()) else 0)


if __name__ == "__main__":
    main()
