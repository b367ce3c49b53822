"""Where a launch's time goes: the phases of `python -m launcher --nproc_per_node N noop.py`, in order.

Run:  .venv/bin/python scripts/bench/launch_phases.py [--reps 7] [--nproc 8] [--editable]

Each run goes through a tiny wrapper (as `launch_overhead.py`'s RSS runs do) that runs the launcher
as `python -m launcher` does and stamps the wall clock at the seams it can see without touching the
launcher: interpreter up (the wrapper's first line), `launcher.cli.commands` imported (click and the
config), `config.from_flags` entered (click parsed the flags) and returned (the config built), the
agent's machinery imported (`launcher.cli.run`, done right after, as `commands` would); then the
`--events_file` events (the first round's `rendezvous`, the first and last `spawn`, the last worker
`exit`, `finished`), and the process gone, seen by this script. The wrapper's cost is a few
imports already made by the interpreter. Every figure is seconds from the launch, median over
--reps; a bare `python -c pass` is timed alongside for scale. Processes run as an installed
launcher would (launch_overhead.py's throwaway venv, warm bytecode cache) unless --editable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import launch_overhead as lo

WRAPPER = r"""
import sys, time
stamps = {"interpreter": time.time()}
out = sys.argv.pop(1)

def save():
    import json
    with open(out, "w") as f:
        json.dump(stamps, f)

import atexit
atexit.register(save)
try:
    import launcher.cli.start as entry  # what `python -m launcher` imports since issue 43
except ImportError:
    import launcher.cli.commands as entry  # before it
stamps["cli imported"] = time.time()
import launcher.config as cfg
from_flags = cfg.from_flags

def timed_from_flags(**kw):
    stamps["flags parsed"] = time.time()
    config = from_flags(**kw)
    stamps["config built"] = time.time()
    import launcher.cli.run
    stamps["agent imported"] = time.time()
    return config

cfg.from_flags = timed_from_flags
sys.argv[0] = "launcher"
entry.main()
"""

PHASES = (
    "interpreter",
    "cli imported",
    "flags parsed",
    "config built",
    "agent imported",
    "rendezvous",
    "first spawn",
    "last spawn",
    "last exit",
    "finished",
    "gone",
)


def one(py: str, wrapper: str, n: int, noop: str, tmp: str) -> dict[str, float]:
    """The phases of one launch, seconds from the launch."""
    stamps, events = os.path.join(tmp, "stamps.json"), os.path.join(tmp, "events.jsonl")
    if os.path.exists(events):
        os.unlink(events)
    cmd = [py, wrapper, stamps, "--events_file", events, "--nproc_per_node", str(n), noop]
    t0 = time.time()
    subprocess.run(cmd, env=lo.ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gone = time.time()
    with open(stamps) as f:
        at = {k: v - t0 for k, v in json.load(f).items()}
    spawns, exits = [], []
    with open(events) as f:
        for line in f:
            e = json.loads(line)
            if e["event"] == "spawn":
                spawns.append(e["time"] - t0)
            elif e["event"] == "exit":
                exits.append(e["time"] - t0)
            elif e["event"] in ("rendezvous", "finished"):
                at.setdefault(e["event"], e["time"] - t0)
    at.update({"first spawn": min(spawns), "last spawn": max(spawns), "last exit": max(exits), "gone": gone - t0})
    return at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--editable", action="store_true", help="run in .venv, editable finder and all")
    args = ap.parse_args()
    lo.ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    lo.ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "launcher-bench-pycache")
    with tempfile.TemporaryDirectory(prefix="bench-phases-") as tmp:
        if not args.editable:
            lo.installed_venv(os.path.join(tmp, "venv"))
        noop, wrapper = os.path.join(tmp, "noop.py"), os.path.join(tmp, "wrapper.py")
        Path(noop).write_text("pass\n")
        Path(wrapper).write_text(WRAPPER)
        one(lo.PY, wrapper, args.nproc, noop, tmp)  # warm the caches; not counted
        runs, bare = [], []
        for _ in range(args.reps):
            runs.append(one(lo.PY, wrapper, args.nproc, noop, tmp))
            t = time.perf_counter()
            subprocess.run([lo.PY, "-c", "pass"], env=lo.ENV, check=True)
            bare.append(time.perf_counter() - t)
    print(
        f"Phases of `launcher --nproc_per_node {args.nproc}` of an empty script, s from the launch, median of {args.reps}"
    )
    print(f"(a bare `python -c pass`: {statistics.median(bare):.3f} s; {os.cpu_count()} CPUs)\n")
    print("| phase | at (s) | since the previous (s) |")
    print("|---|---:|---:|")
    prev = 0.0
    for name in PHASES:
        at = statistics.median(r[name] for r in runs)
        print(f"| {name} | {at:.3f} | {at - prev:+.3f} |")
        prev = at
    sys.stdout.flush()


if __name__ == "__main__":
    main()
