"""The campaign: the command line, then each backend and shape's episodes run, reported and counted."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from collections import Counter

from .episode import run_episode
from .faults import plan
from .net import IS_ROOT, netns_usable, sweep_namespaces
from .records import FAULTS, Fault, Shape


def campaign(backend: str, shape: Shape, seed: int, args: argparse.Namespace, skip: set[Fault], netns: bool) -> int:
    """--episodes episodes of one backend and shape, each reported; how many had violations."""
    label = backend if shape is Shape.ELASTIC else f"{backend} {shape.value}"
    bad, landed, seconds = 0, Counter(), 0.0
    for i in range(args.episodes):
        ep = run_episode(plan(backend, seed + i, skip, shape), args.bound, args.keep, args.verbose, netns)
        status = "ok" if not ep.violations else "VIOLATION"
        print(
            f"chaos: {label} seed {ep.seed}: {status} ({ep.seconds:.0f} s): "
            f"{'; '.join(ep.done) or 'no fault landed'}" + (f" (kept in {ep.kept})" if ep.kept else ""),
            flush=True,
        )
        for line in ep.violations:
            print(
                f"chaos:   {line}   (replay: --backend {backend} --shape {shape.value} --seed {ep.seed} --episodes 1)",
                flush=True,
            )
        bad += bool(ep.violations)
        landed.update(ep.landed)
        seconds += ep.seconds
    counts = ", ".join(f"{f.value} {landed[f]}" for f in FAULTS[backend] if f not in skip)
    print(
        f"chaos: {label}: faults landed: {counts}; {seconds / max(1, args.episodes):.1f} s per episode",
        flush=True,
    )
    print(f"chaos: {label}: {args.episodes} episodes, {bad} with violations", flush=True)
    return bad


def parse(description: str) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--backend", default="c10d,etcd")
    ap.add_argument("--episodes", type=int, default=20, help="per backend and shape")
    ap.add_argument(
        "--shape", default="elastic,spares", help="elastic (--nnodes 2:3), spares (--nnodes 2 and a spare), or both"
    )
    ap.add_argument(
        "--seed", type=int, default=None, help="first episode's seed (default: from the clock); episode i uses seed+i"
    )
    ap.add_argument(
        "--bound", type=float, default=60.0, help="seconds from the first fault until every node must have ended"
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep each episode's folder (logs, checkpoint, the agents' output)"
    )
    ap.add_argument("--verbose", action="store_true", help="print the agents' stderr on a violation")
    return ap.parse_args()


def main(description: str) -> int:
    """Run the campaign the command line asks for; 1 if any episode had a violation, else 0."""
    args = parse(description)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped campaign still cleans its episode up
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    netns = netns_usable()
    skip = set()
    if not (IS_ROOT and shutil.which("mount")):
        skip.add(Fault.DISK_FULL)
    if not netns:
        skip.add(Fault.LINK_CUT)
    else:
        sweep_namespaces()
    print(
        f"chaos: seed {seed}, {args.episodes} episode(s) per backend ({args.backend}); "
        "replay one: --seed S --episodes 1"
        + (f"; skipped (needs root, mount, ip netns): {', '.join(sorted(f.value for f in skip))}" if skip else ""),
        flush=True,
    )
    total = 0
    for backend in args.backend.split(","):
        if backend == "etcd" and not shutil.which("etcd"):
            print("chaos: etcd: no etcd binary on PATH, skipped", flush=True)
            continue
        for shape in [Shape(name) for name in args.shape.split(",")]:
            total += campaign(backend, shape, seed, args, skip, netns)
    return 1 if total else 0
