"""torch's teardown race (issue 32): how often a worker dies of SIGABRT at exit, launcher vs torchrun.

Each run launches `tests/workers/gloo_no_destroy.py` (4 ranks, gloo over env://, one all_reduce, no
`destroy_process_group`: the shape of pytorch's `bin/test_script_init_method.py`), alternating the
commands given. A run whose output holds "terminate called without an active exception" is an abort
(gloo's thread meets the interpreter's finalisation, pytorch#190489); any other failure is counted
apart. `--busy K` runs K busy loops beside it.

    .venv/bin/python scripts/bench/teardown_race.py --runs 20 --busy 2
    .venv/bin/python scripts/bench/teardown_race.py --runs 20 --kinds launcher,finalize,torchrun
    .venv/bin/python scripts/bench/teardown_race.py --runs 10 --kinds baseline,launcher,torchrun --baseline /tmp/old

`--baseline DIR`: kind `baseline` runs `python -m launcher` from DIR (a copy of an older tree's
`launcher/`), the same interpreter.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time

import benchlib
from worker_exit import ABORT, ROOT, busy

WORKER = f"{ROOT}/tests/workers/gloo_no_destroy.py"
COMMANDS = {
    "launcher": [benchlib.PY, "-m", "launcher"],
    "finalize": [benchlib.PY, "-m", "launcher", "--worker_exit", "finalize"],
    "preload": [benchlib.PY, "-m", "launcher", "--preload"],
    "torchrun": [benchlib.PY, "-m", "torch.distributed.run"],
}


def one(kind: str, nproc: int, baseline: str | None) -> tuple[str, float]:
    """("ok" | "abort" | "failed" | "hang", wall seconds) of one launch."""
    where = baseline if kind == "baseline" else ROOT
    cmd = [
        *COMMANDS["launcher" if kind == "baseline" else kind],
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        WORKER,
    ]
    env = dict(os.environ, PYTHONPATH=where)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=where, env=env)
    except subprocess.TimeoutExpired:
        return "hang", time.monotonic() - t0
    wall = time.monotonic() - t0
    if r.returncode == 0:
        return "ok", wall
    if ABORT in r.stdout + r.stderr:
        return "abort", wall
    print(f"{kind}: rc {r.returncode}: {r.stderr[-800:]}", file=sys.stderr)
    return "failed", wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--busy", type=int, default=0, help="busy loops beside the runs")
    p.add_argument("--kinds", default="launcher,torchrun", help=f"comma-separated, of {','.join(COMMANDS)},baseline")
    p.add_argument("--baseline", help="a tree whose launcher/ kind `baseline` runs")
    a = p.parse_args()
    kinds = a.kinds.split(",")
    loops = [multiprocessing.Process(target=busy, daemon=True) for _ in range(a.busy)]
    for b in loops:
        b.start()
    tally = {k: {"ok": 0, "abort": 0, "failed": 0, "hang": 0} for k in kinds}
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for i in range(a.runs):
            for kind in kinds if i % 2 == 0 else reversed(kinds):
                outcome, wall = one(kind, a.nproc, a.baseline)
                tally[kind][outcome] += 1
                walls[kind].append(wall)
                print(f"run {i} {kind}: {outcome} {wall:.2f} s", flush=True)
    finally:
        for b in loops:
            b.terminate()
    for kind in kinds:
        t = tally[kind]
        med = sorted(walls[kind])[len(walls[kind]) // 2]
        print(
            f"{kind:9s} aborts {t['abort']}/{a.runs}  failed {t['failed']}  hangs {t['hang']}  median wall {med:.2f} s"
        )


if __name__ == "__main__":
    main()
