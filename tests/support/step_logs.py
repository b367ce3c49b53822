"""What tests/workers/in_place_exact.py's processes logged: each rank's final weights, the steps it
applied and the sample ids those steps used (read by the exactness tests of in place and of memory)."""

from __future__ import annotations

import collections
from pathlib import Path


def read_step_logs(folder: Path) -> tuple[dict, dict, collections.Counter]:
    """rank -> {(steps, weights, buffers)} of its final processes; rank -> the steps its processes
    applied, in all; sample id -> how many times a step applied it, over the ranks."""
    finals, applied, ids = collections.defaultdict(set), collections.defaultdict(list), collections.Counter()
    for f in folder.iterdir():
        rank = int(f.name.split(".")[0])
        for line in f.read_text().splitlines():
            kind, *rest = line.split()
            if kind == "final":
                finals[rank].add((int(rest[0]), rest[1], rest[2]))
            elif kind == "applied":
                applied[rank].append(int(rest[0]))
                ids.update(int(i) for i in rest[1:])
    return dict(finals), dict(applied), ids
