"""The campaign: the command line, then each backend and shape's episodes run, reported and counted."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from .episode import run_episode
from .faults import plan
from .net import IS_ROOT, netns_usable, sweep_namespaces
from .records import FAULTS, IN_PLACE_DEFAULT, IN_PLACE_FAULTS, IN_PLACE_STEP_COUNT, Fault, Shape, in_place_world
from .reference import Reference, reference


def campaign(backend: str, shape: Shape, seed: int, args: argparse.Namespace, skip: set[Fault], netns: bool) -> int:
    """--episodes episodes of one backend and shape, each reported; how many had violations."""
    label = backend if shape is Shape.ELASTIC else f"{backend} {shape.value}"
    if shape is Shape.IN_PLACE:
        skip = {f for f in IN_PLACE_FAULTS if f not in args.in_place_faults}
    bad, landed, seconds = 0, Counter(), 0.0
    for i in range(args.episodes):
        ep = plan(backend, seed + i, skip, shape)
        ref = None
        if shape is Shape.IN_PLACE:
            ep.train_seed = args.train_seed
            ref = reference_of(args, in_place_world(ep.spare))
        ep = run_episode(ep, args.bound, args.keep, args.verbose, netns, ref)
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
    kinds = IN_PLACE_FAULTS if shape is Shape.IN_PLACE else FAULTS[backend]
    counts = ", ".join(f"{f.value} {landed[f]}" for f in kinds if f not in skip)
    print(
        f"chaos: {label}: faults landed: {counts}; {seconds / max(1, args.episodes):.1f} s per episode",
        flush=True,
    )
    print(f"chaos: {label}: {args.episodes} episodes, {bad} with violations", flush=True)
    return bad


REFERENCES: dict[int, Reference] = {}  # world size -> this campaign's reference


def reference_of(args: argparse.Namespace, world: int) -> Reference:
    """The in-place job's undisturbed final weights for `world` ranks (said once per campaign)."""
    if world not in REFERENCES:
        REFERENCES[world] = reference(args.dir, world, IN_PLACE_STEP_COUNT, args.train_seed)
        print(f"chaos: {REFERENCES[world].describe()}", flush=True)
    return REFERENCES[world]


def in_place_faults(text: str) -> tuple[Fault, ...]:
    """--in-place-faults: a comma list of the in-place shape's fault kinds."""
    names = {f.value: f for f in IN_PLACE_FAULTS}
    bad = [x for x in text.split(",") if x not in names]
    if bad:
        raise argparse.ArgumentTypeError(f"{','.join(bad)}: not an in-place fault (one of {', '.join(names)})")
    return tuple(names[x] for x in text.split(","))


def parse(description: str) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--backend", default="c10d,etcd")
    ap.add_argument("--episodes", type=int, default=20, help="per backend and shape")
    ap.add_argument(
        "--shape",
        default="elastic,spares",
        help="comma-separated: elastic (--nnodes 2:3), spares (--nnodes 2 and a spare), in-place (--recovery in-place)",
    )
    ap.add_argument(
        "--in-place-faults",
        type=in_place_faults,
        default=IN_PLACE_DEFAULT,
        help="the in-place shape's fault kinds, of "
        + ",".join(f.value for f in IN_PLACE_FAULTS)
        + " (default: "
        + ",".join(f.value for f in IN_PLACE_DEFAULT)
        + "; agent-kill runs two members and a spare)",
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
    ap.add_argument(
        "--dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "chaos-campaign",
        help="the campaign's folder: the in-place shape caches there its undisturbed runs' final weights",
    )
    ap.add_argument(
        "--train-seed", type=int, default=0, help="the in-place worker's SEED (its data, initial model, dropout)"
    )
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
