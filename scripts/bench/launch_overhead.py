"""Launch overhead: the launcher vs torchrun on a script that does nothing, side by side.

Run:  .venv/bin/python scripts/bench/launch_overhead.py [--reps 7] [--nprocs 1,2,4,8]

For each N in --nprocs, three ways of running N processes of an empty script (`noop.py`, written
to a temporary folder) are timed, whole process, from spawn to exit, output to /dev/null:

- floor:    N bare `python -u noop.py` started in parallel by this script and waited for
            (what the workers alone cost; a launcher cannot beat it);
- launcher: `python -m launcher --nproc_per_node N noop.py`;
- torchrun: `torchrun --nproc_per_node N noop.py`.

Each repetition runs all three for every N, rotating their order from one repetition to the next
so drift (page cache, CPU frequency) spreads over all tools. Reported: median wall time,
launcher - floor, and torchrun / launcher.

Agent peak RSS is measured in extra runs (--rss-reps each, the largest kept) through a tiny
in-process wrapper: it registers an `atexit` hook, then runs the tool exactly as its entry point
does (`runpy` of `launcher`, like `python -m`; `torch.distributed.run.main()`, like the `torchrun`
script). The hook runs last, as the agent exits, and reads `VmHWM` (the kernel's high-water mark
of resident memory) from /proc/self/status: the agent process alone. Workers and helpers are
separate processes with their own counters, so they are not included (os.wait4/RUSAGE_CHILDREN
would fold the largest waited-for descendant into ru_maxrss). For the launcher, the wrapper also
reads the forked "launcher-guard" helper's VmHWM and its private memory (Private_Clean +
Private_Dirty of /proc/<pid>/smaps_rollup, i.e. what it does not share copy-on-write with the
agent), just before the agent tells it to leave.

Bytecode: this VM exports PYTHONDONTWRITEBYTECODE=1 and the launcher is an editable install, so
its modules (unlike torch's, compiled by pip) would be recompiled from source on every launch
(~30 ms here). An installed package always has its .pyc files, so by default every process this
script starts gets PYTHONPYCACHEPREFIX=<tmp>/launcher-bench-pycache and bytecode writing on: all
three tools read warm bytecode from one cache, filled by untimed warm-up runs. --as-is keeps the
inherited environment instead.

The machine's load average is printed before and after: other work on the host inflates every
figure, the floor included, which is why the tools alternate and the ratios matter most.

Targets (shared/DESIGN.md): at N=8, launcher <= floor + 0.15 s and >= 10x faster than torchrun;
agent peak RSS <= 30 MiB. The script reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
ENV = dict(os.environ)
TORCHRUN = str(Path(PY).with_name("torchrun"))
MiB = 1024.0

RSS_WRAPPER = r'''
import atexit, json, os, sys
out, tool = sys.argv.pop(1), sys.argv.pop(1)
stats = {}

def kib(pid, field, name="status"):
    total = 0
    with open(f"/proc/{pid}/{name}") as f:
        for line in f:
            key = line.split(":")[0]
            if key in field:
                total += int(line.split()[1])
    return total

def dump():
    stats["agent_hwm_kib"] = kib("self", ("VmHWM",))
    with open(out, "w") as f:
        json.dump(stats, f)

atexit.register(dump)  # registered first, so it runs last
if tool == "launcher":
    import runpy
    import launcher.process as p
    stop = p.Guard.stop
    def measured_stop(self):
        if self.pid:
            stats["guard_hwm_kib"] = kib(self.pid, ("VmHWM",))
            stats["guard_private_kib"] = kib(self.pid, ("Private_Clean", "Private_Dirty"), "smaps_rollup")
        stop(self)
    p.Guard.stop = measured_stop
    sys.argv[0] = "launcher"
    runpy.run_module("launcher", run_name="__main__", alter_sys=True)
else:
    from torch.distributed.run import main
    sys.argv[0] = "torchrun"
    sys.exit(main())
'''


def floor(n: int, noop: str) -> float:
    """N bare interpreters running the empty script, started together and all waited for."""
    t = time.perf_counter()
    procs = [subprocess.Popen([PY, "-u", noop], env=ENV) for _ in range(n)]
    for p in procs:
        p.wait()
    return time.perf_counter() - t


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    rc = subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    elapsed = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}")
    return elapsed


def command(tool: str, n: int, noop: str) -> list[str]:
    if tool == "launcher":
        return [PY, "-m", "launcher", "--nproc_per_node", str(n), noop]
    return [TORCHRUN, "--nproc_per_node", str(n), noop]


def peak_rss(tool: str, n: int, noop: str, wrapper: str, tmp: str) -> dict:
    out = os.path.join(tmp, f"rss-{tool}-{n}.json")
    timed([PY, wrapper, out, tool, "--nproc_per_node", str(n), noop])
    with open(out) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per tool and N")
    ap.add_argument("--rss-reps", type=int, default=2, help="extra wrapped runs per tool and N for peak RSS")
    ap.add_argument("--nprocs", default="1,2,4,8")
    ap.add_argument("--as-is", action="store_true", help="keep the inherited bytecode settings")
    args = ap.parse_args()
    if not args.as_is:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "launcher-bench-pycache")
    nprocs = [int(x) for x in args.nprocs.split(",")]
    tools = ["floor", "launcher", "torchrun"]

    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        noop = os.path.join(tmp, "noop.py")
        wrapper = os.path.join(tmp, "rss_wrapper.py")
        Path(noop).write_text("pass\n")
        Path(wrapper).write_text(RSS_WRAPPER)
        floor(1, noop)  # warm the page and bytecode caches; not counted
        for tool in ("launcher", "torchrun"):
            timed(command(tool, 1, noop))
        load_before = os.getloadavg()

        times: dict[tuple[str, int], list[float]] = {(t, n): [] for t in tools for n in nprocs}
        started = time.perf_counter()
        for rep in range(args.reps):
            for n in nprocs:
                for tool in tools[rep % 3:] + tools[: rep % 3]:  # rotate the order every repetition
                    t = floor(n, noop) if tool == "floor" else timed(command(tool, n, noop))
                    times[tool, n].append(t)
        rss = {(t, n): [peak_rss(t, n, noop, wrapper, tmp) for _ in range(args.rss_reps)]
               for n in nprocs for t in ("launcher", "torchrun")}
        total = time.perf_counter() - started
        load_after = os.getloadavg()

    def med(tool: str, n: int) -> float:
        return statistics.median(times[tool, n])

    def most(tool: str, n: int, key: str) -> float:
        return max(r.get(key, 0) for r in rss[tool, n]) / MiB

    print(f"# Launch overhead, {datetime.date.today()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"torch {importlib.metadata.version('torch')}")
    cache = "inherited environment" if args.as_is else "warm bytecode cache"
    print(f"\nMedian of {args.reps} runs (rotating order, {cache}); peak RSS = largest VmHWM of {args.rss_reps} "
          f"wrapped runs. Load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}.\n")
    print("| N | floor (s) | launcher (s) | launcher − floor (s) | torchrun (s) | torchrun / launcher "
          "| launcher agent peak RSS (MiB) | guard peak RSS / private (MiB) | torchrun agent peak RSS (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in nprocs:
        fl, la, tr = med("floor", n), med("launcher", n), med("torchrun", n)
        print(f"| {n} | {fl:.3f} | {la:.3f} | {la - fl:+.3f} | {tr:.3f} | {tr / la:.1f}× "
              f"| {most('launcher', n, 'agent_hwm_kib'):.1f} "
              f"| {most('launcher', n, 'guard_hwm_kib'):.1f} / {most('launcher', n, 'guard_private_kib'):.1f} "
              f"| {most('torchrun', n, 'agent_hwm_kib'):.1f} |")

    n = max(nprocs)
    fl, la, tr = med("floor", n), med("launcher", n), med("torchrun", n)
    agent = max(most("launcher", k, "agent_hwm_kib") for k in nprocs)
    verdict = {True: "met", False: "MISSED"}
    print(f"\nTargets at N={n}: launcher − floor = {la - fl:.3f} s (≤ 0.15 s: {verdict[la - fl <= 0.15]}); "
          f"torchrun / launcher = {tr / la:.1f}× (≥ 10×: {verdict[tr / la >= 10]}); "
          f"launcher agent peak RSS ≤ {agent:.1f} MiB (≤ 30 MiB: {verdict[agent <= 30]}).")
    print(f"Min–max wall at N={n}: floor {min(times['floor', n]):.3f}–{max(times['floor', n]):.3f} s, "
          f"launcher {min(times['launcher', n]):.3f}–{max(times['launcher', n]):.3f} s, "
          f"torchrun {min(times['torchrun', n]):.3f}–{max(times['torchrun', n]):.3f} s. Measured in {total:.0f} s.")


if __name__ == "__main__":
    main()
