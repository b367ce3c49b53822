"""Restart latency and idle agent CPU: the launcher vs torchrun, side by side in one run.

Run:  .venv/bin/python scripts/bench/restart_latency.py [--restarts 12] [--jobs 2]

1. Restart latency: worker exit -> every replacement worker spawned. Each job is
   `<tool> --nproc_per_node 2 --max_restarts K worker.py` (default --monitor_interval 0.1 for
   both). On every attempt but the last, local rank 1 waits for rank 0 to be up, sleeps 0.3 s,
   writes time.time() to a file and calls os._exit(1); rank 0 sleeps until the agent stops it.
   Every worker stamps time.time() as the script's first statement. Per restart,
   raw = max(start stamps of attempt k+1's workers) - exit stamp of attempt k's rank 1.
   raw includes Python's start-up up to the script's first line (the same for both tools), so
   it is also measured: 2 bare interpreters running that first line, started in parallel by this
   script, 5 samples before every job (same load); adjusted = raw - their median, i.e. what the
   agent adds (notice the exit, stop rank 0, next round, spawn). A cross-check free of start-up:
   exit -> fork, from each replacement's kernel start time (/proc/self/stat starttime, 10 ms
   ticks, centred by half a tick) against CLOCK_BOOTTIME at the failing worker's exit. Jobs
   alternate between the tools; medians are over all K x --jobs restarts of each tool.

2. Idle agent CPU: `<tool> --nproc_per_node 2 idle.py`, both workers sleeping 11 s. From 0.5 s
   after both started, for 8 s: the agent process's own CPU clock (all its threads, not its
   children; ns resolution) and its threads' voluntary context switches (wake-ups), reported as
   % of one core and wake-ups per second. The launcher's "launcher-guard" helper likewise.

Target (shared/DESIGN.md): launcher restart <= 0.05 s median (torchrun ~0.3 s). Reports only,
asserts nothing. Other load on the host inflates both tools: the CPU used meanwhile by processes
this script did not start (/proc/stat busy time minus its getrusage) is printed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
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
TOOLS = ("launcher", "torchrun")
HOLD = 0.3  # how long the failing worker runs once the group is up
WINDOW = 8.0  # idle sampling window, seconds

WORKER = f"""import time
T0 = time.time()
import os, sys
FORK = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
out, last = sys.argv[1], int(sys.argv[2])
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.environ["LOCAL_RANK"]
with open(f"{{out}}/start-{{attempt}}-{{rank}}", "w") as f:
    f.write(f"{{T0!r}} {{FORK!r}}")
if attempt >= last:
    sys.exit(0)
if rank == "1":
    while not os.path.exists(f"{{out}}/start-{{attempt}}-0"):  # rank 0 is up: a clean restart
        time.sleep(0.01)
    time.sleep({HOLD})
    with open(f"{{out}}/exit-{{attempt}}", "w") as f:
        f.write(f"{{time.time()!r}} {{time.clock_gettime(time.CLOCK_BOOTTIME)!r}}")
    os._exit(1)
time.sleep(60)  # stopped by the agent
"""

PROBE = 'import time\nT0 = time.time()\nimport sys\nopen(sys.argv[1], "w").write(repr(T0))\n'
IDLE = 'import os, sys, time\nopen(os.path.join(sys.argv[1], os.environ["LOCAL_RANK"]), "w").close()\ntime.sleep(11)\n'


def command(tool: str, *args: str) -> list[str]:
    return [PY, "-m", "launcher", *args] if tool == "launcher" else [TORCHRUN, *args]


def stamp(path: str, field: int = 0) -> float:
    with open(path) as f:
        return float(f.read().split()[field])


def bare_start(tmp: str, n: int = 2, reps: int = 5) -> list[float]:
    """Time from spawning n bare interpreters together to the last one's first line, `reps` times."""
    probe = os.path.join(tmp, "probe.py")
    Path(probe).write_text(PROBE)
    outs, samples = [os.path.join(tmp, f"probe-{i}") for i in range(n)], []
    for _ in range(reps):
        t = time.time()
        for p in [subprocess.Popen([PY, "-u", probe, out]) for out in outs]:
            p.wait()
        samples.append(max(stamp(out) for out in outs) - t)
    return samples


def restart_job(tool: str, tmp: str, job: int, restarts: int) -> list[tuple[float, float]]:
    """Run one job with `restarts` failures; (raw latency, exit -> fork) of each restart."""
    out = os.path.join(tmp, f"{tool}-{job}")
    os.makedirs(out)
    cmd = command(
        tool,
        "--nproc_per_node",
        "2",
        "--max_restarts",
        str(restarts),
        os.path.join(tmp, "worker.py"),
        out,
        str(restarts),
    )
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}")
    half_tick = 0.5 / os.sysconf("SC_CLK_TCK")  # kernel start times are whole ticks, rounded down
    latencies = []
    for k in range(restarts):
        starts = [os.path.join(out, f"start-{k + 1}-{rank}") for rank in (0, 1)]
        ended = os.path.join(out, f"exit-{k}")
        latencies.append(
            (
                max(stamp(s) for s in starts) - stamp(ended),
                max(stamp(s, 1) for s in starts) + half_tick - stamp(ended, 1),
            )
        )
    return latencies


def usage(pid: int) -> tuple[float, int]:
    """CPU seconds of the whole process (all threads, ended ones too) and its threads' wake-ups."""
    cpu = time.clock_gettime(((~pid) << 3) | 2)  # Linux's clock_getcpuclockid(pid), which Python lacks
    wakeups = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                wakeups += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except OSError:
            pass  # a thread that just ended
    return cpu, wakeups


def idle_cpu(tool: str, tmp: str) -> list[tuple[float, float]]:
    """(% of one core, wake-ups per second) of the agent, then of the launcher-guard if any."""
    ready = os.path.join(tmp, f"idle-{tool}")
    os.makedirs(ready)
    agent = subprocess.Popen(
        command(tool, "--nproc_per_node", "2", os.path.join(tmp, "idle.py"), ready),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while len(os.listdir(ready)) < 2:
        if agent.poll() is not None:
            raise SystemExit(f"{tool} exited {agent.returncode} before its workers started")
        time.sleep(0.01)
    time.sleep(0.5)
    children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    pids = [agent.pid] + [int(c) for c in children if Path(f"/proc/{c}/comm").read_text() == "launcher-guard\n"][:1]
    t, before = time.perf_counter(), [usage(p) for p in pids]
    time.sleep(WINDOW)
    after, wall = [usage(p) for p in pids], time.perf_counter() - t
    agent.wait()
    return [(100 * (a[0] - b[0]) / wall, (a[1] - b[1]) / wall) for b, a in zip(before, after)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--restarts", type=int, default=12, help="restarts per job (--max_restarts)")
    ap.add_argument("--jobs", type=int, default=2, help="jobs per tool, alternating tools")
    args = ap.parse_args()

    before = cpu_snapshot()
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        Path(tmp, "worker.py").write_text(WORKER)
        Path(tmp, "idle.py").write_text(IDLE)
        bare: list[float] = []
        runs: dict[str, list[tuple[float, float]]] = {t: [] for t in TOOLS}
        for job in range(args.jobs):
            for tool in TOOLS if job % 2 == 0 else TOOLS[::-1]:
                bare += bare_start(tmp)  # interleaved, so the baseline sees the same load
                runs[tool] += restart_job(tool, tmp, job, args.restarts)
        idle = {tool: idle_cpu(tool, tmp) for tool in TOOLS}
    after = cpu_snapshot()

    baseline = statistics.median(bare)
    raw = {t: [r for r, _ in runs[t]] for t in TOOLS}
    med = {t: statistics.median(raw[t]) for t in TOOLS}
    adj = {t: med[t] - baseline for t in TOOLS}
    fork = {t: statistics.median(f for _, f in runs[t]) for t in TOOLS}
    print(
        f"# Restart latency and idle CPU, {datetime.date.today()}, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}, torch {importlib.metadata.version('torch')}"
    )
    print(
        f"\n2 workers, --max_restarts {args.restarts}, {args.jobs} jobs per tool (alternating), default "
        f"--monitor_interval 0.1. Bare start of 2 interpreters in parallel: {baseline:.3f} s (median of "
        f"{len(bare)}; subtracted for 'adjusted'). Other processes used {other_load(before, after):.2f} "
        f"of {os.cpu_count()} cores meanwhile; {after[0] - before[0]:.0f} s.\n"
    )
    print("| tool | restarts | raw median (s) | raw p10–p90 (s) | adjusted median (s) | exit → fork median (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in TOOLS:
        deciles = statistics.quantiles(raw[t], n=10)
        print(
            f"| {t} | {len(raw[t])} | {med[t]:.3f} | {deciles[0]:.3f}–{deciles[-1]:.3f} "
            f"| {adj[t]:.3f} | {fork[t]:.3f} |"
        )

    def ratio(d: dict[str, float]) -> str:
        return f"{d['torchrun'] / d['launcher']:.1f}×" if d["launcher"] > 0 else "n/a"

    verdict = {True: "met", False: "MISSED"}
    print(
        f"\ntorchrun / launcher: {ratio(med)} raw, {ratio(adj)} adjusted, {ratio(fork)} exit → fork. "
        f"Target launcher ≤ 0.05 s median: adjusted {adj['launcher']:.3f} s "
        f"({verdict[adj['launcher'] <= 0.05]}), exit → fork {fork['launcher']:.3f} s "
        f"({verdict[fork['launcher'] <= 0.05]})."
    )

    print(f"\nIdle supervision, 2 sleeping workers, sampled over {WINDOW:g} s:\n")
    print("| tool | agent CPU (% of one core) | agent wake-ups / s | launcher-guard CPU (%) / wake-ups / s |")
    print("|---|---:|---:|---:|")
    for t in TOOLS:
        (cpu, wakeups), *guard = idle[t]
        helper = f"{guard[0][0]:.3f} / {guard[0][1]:.1f}" if guard else "—"
        print(f"| {t} | {cpu:.3f} | {wakeups:.1f} | {helper} |")


if __name__ == "__main__":
    main()
