"""Launch overhead: the launcher vs torchrun on a script that does nothing, side by side.

Run:  .venv/bin/python scripts/bench/launch_overhead.py [--reps 7] [--pairs 3] [--nprocs 1,2,4,8]

For each N, three ways of running N processes of an empty script (`noop.py`, in a temporary
folder) are timed whole, spawn to exit, output to /dev/null. Each repetition, for every N, runs
torchrun once and --pairs back-to-back (floor, launcher) pairs, every order alternating between
repetitions. Reported: median (min) wall time; launcher - floor as the median of the paired
differences (robust to load that drifts over seconds); torchrun / launcher.
- floor:    N bare `python -u noop.py` started in parallel and waited for (the workers alone);
- launcher: `python -m launcher --nproc_per_node N noop.py`;
- torchrun: `torchrun --nproc_per_node N noop.py`.

Agent peak RSS and CPU come from --rss-reps extra runs through a tiny in-process wrapper that
registers an atexit hook, then runs the tool as its entry point does (`runpy` of `launcher`, like
`python -m`; `torch.distributed.run.main()`, like the torchrun script). The hook runs last, as the
agent exits, and reads VmHWM (the kernel's resident-memory high-water mark) from /proc/self/status
and os.times() user + system: the agent process alone, all threads, no children (os.wait4 would
fold the largest waited-for descendant into ru_maxrss). For the launcher it also reads the forked
"launcher-guard" helper's VmHWM and private memory (Private_* of smaps_rollup: what it does not
share copy-on-write with the agent) just before the agent tells the guard to leave.

Bytecode: this VM exports PYTHONDONTWRITEBYTECODE=1 and the launcher is an editable install, so
its modules (unlike torch's, compiled by pip) would be recompiled on every launch (~30 ms). An
installed package has its .pyc files, so every process gets bytecode writing on and
PYTHONPYCACHEPREFIX=<tmp>/launcher-bench-pycache: all read one warm cache, filled by untimed
warm-up runs (--as-is keeps the inherited environment). Other work on the host inflates every
figure: the CPU used meanwhile by processes this script did not start is printed.

Installed, not editable: the editable install's finder (a .pth file) runs in every interpreter
of .venv and costs ~20 ms of start-up each, agent and workers alike, which no user of a
pip-installed package pays. So every process runs in a throwaway venv of the same interpreter
whose one .pth file puts .venv's site-packages (torch, click, psutil, ...) and the repository
(the launcher package) on sys.path, as an installed package would be; torchrun is .venv's
script with that venv's python. --editable measures in .venv itself.

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

from benchlib import cpu_snapshot, other_load

PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))
ENV = dict(os.environ)
ROOT = str(Path(__file__).resolve().parents[2])


def installed_venv(folder: str) -> None:
    """Point PY and TORCHRUN at a venv that sees .venv's packages and the launcher as installed ones."""
    global PY, TORCHRUN
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", folder], check=True)
    py = os.path.join(folder, "bin", "python")
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True, capture_output=True, text=True
    ).stdout.strip()
    ours = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    Path(site, "bench-installed.pth").write_text(f"{ROOT}\n{ours}\n")  # path lines only: no .pth of theirs runs
    script = Path(TORCHRUN).read_text().split("\n", 1)[1]
    TORCHRUN = os.path.join(folder, "bin", "torchrun")
    Path(TORCHRUN).write_text(f"#!{py}\n{script}")
    os.chmod(TORCHRUN, 0o755)
    PY = py


MiB = 1024.0
FLAGS: list[str] = []  # --launcher-flags
TOOLS = ("floor", "launcher", "torchrun")

WRAPPER = r"""
import atexit, json, os, sys
out, tool = sys.argv.pop(1), sys.argv.pop(1)
stats = {}

def kib(pid, fields, name="status"):
    return sum(int(l.split()[1]) for l in open(f"/proc/{pid}/{name}") if l.split(":")[0] in fields)

def dump():
    stats["agent_rss"] = kib("self", ("VmHWM",))
    stats["agent_cpu"] = os.times().user + os.times().system  # this process, all threads, no children
    json.dump(stats, open(out, "w"))

atexit.register(dump)  # registered first, so it runs last
if tool == "launcher":
    import runpy
    import launcher.agent.process as p
    stop = p.Guard.stop
    def measured_stop(self):
        if self.pid:
            stats["guard_rss"] = kib(self.pid, ("VmHWM",))
            stats["guard_private"] = kib(self.pid, ("Private_Clean", "Private_Dirty"), "smaps_rollup")
        stop(self)
    p.Guard.stop = measured_stop
    sys.argv[0] = "launcher"
    runpy.run_module("launcher", run_name="__main__", alter_sys=True)
else:
    from torch.distributed.run import main
    sys.argv[0] = "torchrun"
    sys.exit(main())
"""


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
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}")
    return time.perf_counter() - t


def command(tool: str, n: int, noop: str) -> list[str]:
    if tool == "launcher":
        return [PY, "-m", "launcher", *FLAGS, "--nproc_per_node", str(n), noop]
    return [TORCHRUN, "--nproc_per_node", str(n), noop]


def pair(n: int, noop: str, floor_first: bool) -> tuple[float, float]:
    """(floor, launcher) wall times, run back to back in the given order."""
    if floor_first:
        fl = floor(n, noop)
        return fl, timed(command("launcher", n, noop))
    la = timed(command("launcher", n, noop))
    return floor(n, noop), la


def agent_stats(tool: str, n: int, noop: str, tmp: str) -> dict:
    """One wrapped run: the agent's peak RSS (KiB) and CPU (s), and the guard's memory (KiB)."""
    out = os.path.join(tmp, "stats.json")
    flags = FLAGS if tool == "launcher" else []
    timed([PY, os.path.join(tmp, "wrapper.py"), out, tool, *flags, "--nproc_per_node", str(n), noop])
    with open(out) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="repetitions (torchrun runs per N)")
    ap.add_argument("--pairs", type=int, default=3, help="(floor, launcher) pairs per repetition and N")
    ap.add_argument("--rss-reps", type=int, default=1, help="wrapped runs per tool and N (RSS, CPU)")
    ap.add_argument("--nprocs", default="1,2,4,8")
    ap.add_argument("--as-is", action="store_true", help="keep the inherited bytecode settings")
    ap.add_argument("--launcher-flags", default="", help="more launcher flags, e.g. '--metrics_port 0'")
    ap.add_argument("--editable", action="store_true", help="run in .venv, editable finder and all")
    args = ap.parse_args()
    FLAGS.extend(args.launcher_flags.split())
    if not args.as_is:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "launcher-bench-pycache")
    nprocs = [int(x) for x in args.nprocs.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        if not args.editable:
            installed_venv(os.path.join(tmp, "venv"))
        noop = os.path.join(tmp, "noop.py")
        Path(noop).write_text("pass\n")
        Path(tmp, "wrapper.py").write_text(WRAPPER)
        floor(1, noop)  # warm the page and bytecode caches; not counted
        for tool in ("launcher", "torchrun"):
            timed(command(tool, 1, noop))

        before = cpu_snapshot()
        times: dict[tuple[str, int], list[float]] = {(t, n): [] for t in TOOLS for n in nprocs}
        paired: dict[int, list[float]] = {n: [] for n in nprocs}
        for rep in range(args.reps):
            for n in nprocs:
                torchrun_first = rep % 2 == 1
                if torchrun_first:
                    times["torchrun", n].append(timed(command("torchrun", n, noop)))
                for i in range(args.pairs):
                    fl, la = pair(n, noop, floor_first=(rep + i) % 2 == 0)
                    times["floor", n].append(fl)
                    times["launcher", n].append(la)
                    paired[n].append(la - fl)
                if not torchrun_first:
                    times["torchrun", n].append(timed(command("torchrun", n, noop)))
        stats = {
            (t, n): [agent_stats(t, n, noop, tmp) for _ in range(args.rss_reps)]
            for n in nprocs
            for t in ("launcher", "torchrun")
        }
        after = cpu_snapshot()

    def med(tool: str, n: int) -> float:
        return statistics.median(times[tool, n])

    def wall(tool: str, n: int) -> str:
        return f"{med(tool, n):.3f} ({min(times[tool, n]):.3f})"

    def agent(tool: str, n: int, key: str, pick=max) -> float:
        return pick(s.get(key, 0) for s in stats[tool, n])

    print(
        f"# Launch overhead, {datetime.date.today()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"torch {importlib.metadata.version('torch')}"
    )
    cache = ("inherited environment" if args.as_is else "warm bytecode cache") + (
        "; editable install (.venv)" if args.editable else "; as installed (a venv without the editable finder)"
    )
    print(
        f"\nWall time, median (min); torchrun {args.reps} runs, floor and launcher {args.reps * args.pairs} "
        f"alternating pairs; {cache}. Other processes used "
        f"{other_load(before, after):.2f} of {os.cpu_count()} cores meanwhile; {after[0] - before[0]:.0f} s.\n"
    )
    print("| N | floor (s) | launcher (s) | launcher − floor (s) | torchrun (s) | torchrun / launcher |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in nprocs:
        print(
            f"| {n} | {wall('floor', n)} | {wall('launcher', n)} | {statistics.median(paired[n]):+.3f} "
            f"| {wall('torchrun', n)} | {med('torchrun', n) / med('launcher', n):.1f}× |"
        )

    print(
        f"\nAgent process alone, {args.rss_reps} wrapped run(s) per tool and N: peak RSS (VmHWM, largest), CPU time "
        f"(user + system, smallest); launcher-guard peak RSS / private memory (largest).\n"
    )
    print(
        "| N | launcher agent RSS (MiB) | launcher agent CPU (s) | launcher-guard RSS / private (MiB) "
        "| torchrun agent RSS (MiB) | torchrun agent CPU (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n in nprocs:
        print(
            f"| {n} | {agent('launcher', n, 'agent_rss') / MiB:.1f} | {agent('launcher', n, 'agent_cpu', min):.3f} "
            f"| {agent('launcher', n, 'guard_rss') / MiB:.1f} / {agent('launcher', n, 'guard_private') / MiB:.1f} "
            f"| {agent('torchrun', n, 'agent_rss') / MiB:.1f} | {agent('torchrun', n, 'agent_cpu', min):.3f} |"
        )

    n = max(nprocs)
    over, ratio = statistics.median(paired[n]), med("torchrun", n) / med("launcher", n)
    peak = max(agent("launcher", k, "agent_rss") for k in nprocs) / MiB
    verdict = {True: "met", False: "MISSED"}
    print(
        f"\nTargets at N={n}: launcher − floor = {over:.3f} s (≤ 0.15 s: {verdict[over <= 0.15]}); "
        f"torchrun / launcher = {ratio:.1f}× (≥ 10×: {verdict[ratio >= 10]}); "
        f"launcher agent peak RSS {peak:.1f} MiB (≤ 30 MiB: {verdict[peak <= 30]})."
    )


if __name__ == "__main__":
    main()
