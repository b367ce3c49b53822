"""all_reduce busbw through the launcher vs the same benchmark started by hand, side by side.

Run:  .venv/bin/python scripts/bench/allreduce_overhead.py [--reps 7] [--nproc 2] [-- bench args]
      (bench args default: -b 1K -e 16M -f 4 -w 5 -n 50: the sizes of docs/examples.md's example, more iterations)

Each repetition runs the benchmark (`python -m launcher.worker.allreduce ARGS -J rows.json`) twice, in an
order that alternates between repetitions, so drift on a shared machine hits both:
- launcher: `python -m launcher --nproc_per_node N -m launcher.worker.allreduce ARGS`;
- by hand:  N processes `python -m launcher.worker.allreduce ARGS` started here at once, with RANK,
  LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, and
  OMP_NUM_THREADS=1 as the launcher (like torchrun) sets for N > 1 workers on a node, so both runs
  do the same work with the same threads; rank 0 hosts the store in both.
Reported per size and placement: the median busbw over the repetitions of each, and launcher / hand
(1.00 = no difference; the target is within 5 %). Overall: the geometric mean of those ratios, and
the ratio of the medians of nccl-tests' "Avg bus bandwidth", and the spread of the per-repetition
ratios of that figure (launcher run / the by-hand run next to it), which says how much of a
difference the noise alone makes. The launcher touches no data: the one way it can slow the workers
is CPU taken from them, so the agent's own CPU time (utime + stime from /proc, sampled until it
exits) is reported against the run's wall time. The load average before and after is printed:
other work on the host moves every figure. The script reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import free_port

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
DEFAULT = ["-b", "1K", "-e", "16M", "-f", "4", "-w", "5", "-n", "50"]


def cpu_seconds(pid: int) -> float:
    """utime + stime of this process alone (not its children), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_launcher(n: int, bench: list[str], out: Path) -> dict:
    cmd = [PY, "-m", "launcher", "--nproc_per_node", str(n), "-m", "launcher.worker.allreduce", *bench, "-J", str(out)]
    t0, cpu = time.monotonic(), 0.0
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    while p.poll() is None:  # the agent's own CPU, sampled until it exits (the last sample is kept)
        try:
            cpu = cpu_seconds(p.pid)
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    if p.returncode:
        raise SystemExit(f"launcher: exit code {p.returncode}")
    return dict(json.loads(out.read_text()), agent_cpu=cpu, wall=time.monotonic() - t0)


def by_hand(n: int, bench: list[str], out: Path) -> dict:
    port, procs = free_port(), []
    for rank in range(n):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        if n > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(
            subprocess.Popen(
                [PY, "-m", "launcher.worker.allreduce", *bench, "-J", str(out)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
            )
        )
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise SystemExit(f"by hand: exit codes {codes}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("bench", nargs="*", help="benchmark flags after --")
    args = ap.parse_args()
    bench = args.bench or DEFAULT
    runs = {"launcher": [], "hand": []}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = ["launcher", "hand"] if rep % 2 == 0 else ["hand", "launcher"]
            for way in order:
                out = Path(tmp) / f"{way}{rep}.json"
                runs[way].append((with_launcher if way == "launcher" else by_hand)(args.nproc, bench, out))
            print(
                f"rep {rep + 1}/{args.reps}: avg busbw launcher {runs['launcher'][-1]['avg_busbw']:.4f}, "
                f"by hand {runs['hand'][-1]['avg_busbw']:.4f} GB/s",
                file=sys.stderr,
                flush=True,
            )
    load1 = os.getloadavg()

    def median(way, i, place):
        return statistics.median(r["rows"][i][place]["busbw"] for r in runs[way])

    first = runs["launcher"][0]
    print(
        f"`{Path(PY).name} scripts/bench/allreduce_overhead.py --reps {args.reps} --nproc {args.nproc} -- "
        f"{' '.join(bench)}`: {args.nproc} ranks, {first['backend']} on {first['device']}, {os.cpu_count()} cores; "
        f"load average {load0[0]:.2f} before, {load1[0]:.2f} after\n"
    )
    print("| size (B) | out-of-place busbw launcher | by hand | ratio | in-place busbw launcher | by hand | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for i, row in enumerate(first["rows"]):
        cells = []
        for place in ("oop", "ip"):
            a, b = median("launcher", i, place), median("hand", i, place)
            ratios.append(a / b)
            cells += [f"{a:.4f}", f"{b:.4f}", f"{a / b:.3f}"]
        print(f"| {row['size']} | " + " | ".join(cells) + " |")
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    avg = {way: statistics.median(r["avg_busbw"] for r in runs[way]) for way in runs}
    paired = sorted(a["avg_busbw"] / b["avg_busbw"] for a, b in zip(runs["launcher"], runs["hand"]))
    cpu = statistics.median(r["agent_cpu"] for r in runs["launcher"])
    wall = statistics.median(r["wall"] for r in runs["launcher"])
    print(
        f"\nbusbw in GB/s, medians of {args.reps} runs each. Overall launcher / by hand: geometric mean of the "
        f"ratios {geo:.3f}; avg busbw {avg['launcher']:.4f} vs {avg['hand']:.4f} GB/s, ratio "
        f"{avg['launcher'] / avg['hand']:.3f} (target: within 5 %). Per repetition, avg busbw launcher / by hand: "
        f"median {statistics.median(paired):.3f}, range {paired[0]:.3f}-{paired[-1]:.3f}. Agent CPU: "
        f"{cpu:.2f} s in a {wall:.1f} s run (medians), {100 * cpu / wall:.1f} % of one core."
    )


if __name__ == "__main__":
    main()
