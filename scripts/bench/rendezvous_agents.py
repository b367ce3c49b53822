"""K agents on one host, c10d rendezvous: start -> every worker running, the launcher vs torchrun.

Run:  .venv/bin/python scripts/bench/rendezvous_agents.py [--reps 5] [--agents 2,4]

Each run starts K agent processes at once (Popen one after the other, no waiting), all with
`--nnodes K --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:PORT --rdzv_id bench
--rdzv_conf join_timeout=60` on a fresh free port, as `python -m launcher ...` or `torchrun ...`.
The worker writes time.time() as its first statement to a file, sleeps 1 s and exits 0.
Metric: max(worker start time) - time.time() just before the first agent was spawned. Every run
has a 90 s cap; its agents are started in their own process groups, which are killed afterwards.
The tools alternate inside each repetition (order rotated) so drift hits both; reported: median.

torchrun imports torch in its agent for c10d (the TCPStore), which costs seconds on this 2-core VM
when K interpreters import it at once; the launcher's agent speaks the TCPStore protocol itself
(launcher/tcpstore/) and imports no torch. Extra figures, in the rotation with the tools:
- floor: K bare `python -c "import launcher.cli.run, launcher.rendezvous.c10d"` started together,
  until the last has imported them: what a launcher c10d agent pays before it can do anything;
- torch floor: K bare `python -c "import torch.distributed"` likewise (then os._exit: torch's
  interpreter teardown takes ~1 s more): what torchrun's agent pays before it can do anything;
- CPU s: user+system seconds of the K agents (each with the worker it waited for), from wait4;
  less sensitive than wall time to other jobs on the machine (printed: load average);
- torch import in each launcher agent: one extra launcher run per K with `-X importtime` on every
  agent, summing its top-level torch imports (median over agents): 0, the check that it has none.
Bytecode: this VM sets PYTHONDONTWRITEBYTECODE=1 and the launcher is an editable install, so every
process gets PYTHONPYCACHEPREFIX=<tmp>/launcher-bench-pycache with bytecode writing on, filled by
an untimed warm-up run of each tool (as scripts/bench/launch_overhead.py does).
Network: by default the script re-runs itself in a private network namespace that holds only
loopback (`unshare --net`, root only; `--host-net` opts out). torch's TCPStore asks the system
resolver for the name of every peer address (PTR 1.0.0.127.in-addr.arpa, on both ends of each
connection); this VM's resolver is off-host and loses about one query in 25, which costs a 5 s
resolver timeout. In the namespace those lookups fail at once, and no packet leaves the machine.
Target (shared/DESIGN.md, issue 4): 4 agents <= 1 s with c10d (torchrun ~4.4-5.7 s); <= 0.5 s
with etcd. The script asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import free_port, private_network, revision

PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "launcher-bench-pycache")
CAP = 90.0
WORKER = """import os, sys, time
t = time.time()
with open(os.path.join(sys.argv[1], f"{os.getpid()}.start"), "w") as f:
    f.write(repr(t))
time.sleep(1.0)
"""

NET = "private namespace, loopback only" if os.environ.get("BENCH_NETNS") else "host namespace"


def agent_cmd(tool: str, k: int, port: int, worker: str, out: str, importtime: bool = False) -> list[str]:
    flags = [
        "--nnodes",
        str(k),
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        "bench",
        "--rdzv_conf",
        "join_timeout=60",
    ]
    head = [PY, "-m", "launcher"] if tool == "launcher" else [TORCHRUN]
    if importtime:
        head = [PY, "-X", "importtime", "-m", "launcher"]
    return head + flags + [worker, out]


def run_group(cmds: list[list[str]], logs: list[str]) -> tuple[float, list[int | None], float]:
    """Start every command at once, reap all (CAP s at most), kill their process groups after.

    Returns the spawn time, the exit codes and the CPU seconds of the processes (user + system,
    from wait4: each includes the children it waited for, i.e. an agent's worker)."""
    procs, files, cpu = [], [open(p, "w") for p in logs], 0.0
    t0 = time.time()
    try:
        for cmd, f in zip(cmds, files):
            procs.append(subprocess.Popen(cmd, env=ENV, stdout=f, stderr=f, start_new_session=True))
        pending = list(procs)
        while pending and time.time() < t0 + CAP:
            for p in list(pending):
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    p.returncode, cpu = os.waitstatus_to_exitcode(status), cpu + ru.ru_utime + ru.ru_stime
                    pending.remove(p)
            time.sleep(0.01)
        return t0, [p.returncode for p in procs], cpu
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if p.returncode is None:
                p.wait()
        for f in files:
            f.close()


def one_run(
    tool: str, k: int, worker: str, tmp: str, importtime: bool = False
) -> tuple[float | None, float, list[float]]:
    """Seconds from spawn to the last worker's start (None: failed), agents' CPU s, torch import s."""
    out = tempfile.mkdtemp(dir=tmp, prefix=f"{tool}-{k}-")
    port = free_port()
    logs = [os.path.join(out, f"agent{i}.log") for i in range(k)]
    t0, rcs, cpu = run_group([agent_cmd(tool, k, port, worker, out, importtime) for _ in range(k)], logs)
    starts = [float(Path(out, f).read_text()) for f in os.listdir(out) if f.endswith(".start")]
    torch_s = [torch_import_s(Path(p).read_text()) for p in logs] if importtime else []
    if len(starts) != k or any(rc != 0 for rc in rcs):
        tails = "".join("\n    | " + line for p in logs for line in Path(p).read_text().splitlines()[-4:])
        print(f"  {tool} K={k}: FAILED (exit codes {rcs}, {len(starts)}/{k} workers started){tails}", file=sys.stderr)
        return None, cpu, torch_s
    return max(starts) - t0, cpu, torch_s


def torch_import_s(log: str) -> float:
    """Seconds of top-level torch imports in one `-X importtime` stderr (cumulative column)."""
    total = 0
    for m in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", log, re.M):
        if m.group(2) == "torch" or m.group(2).startswith("torch."):  # unindented: top level
            total += int(m.group(1))
    return total / 1e6


FLOORS = {"floor": "launcher.cli.run, launcher.rendezvous.c10d", "torch floor": "torch.distributed"}


def import_floor(k: int, tmp: str, modules: str) -> tuple[float, float]:
    """K bare `import MODULES` started together: seconds until all have imported, CPU s."""
    code = f"import os, time, {modules}; print(repr(time.time()), flush=True); os._exit(0)"
    logs = [os.path.join(tmp, f"floor{i}.log") for i in range(k)]
    t0, _, cpu = run_group([[PY, "-c", code]] * k, logs)
    return max(float(Path(p).read_text().split()[-1]) for p in logs) - t0, cpu


def fmt(x: float | None) -> str:
    return "failed" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--agents", default="2,4")
    ap.add_argument("--host-net", action="store_true", help="run in the host network namespace")
    args = ap.parse_args()
    private_network()
    ks = [int(x) for x in args.agents.split(",")]
    tools = ["launcher", "torchrun", *FLOORS]
    rev = revision()
    print(f"# {datetime.date.today()}  load average before: {os.getloadavg()}; {rev}", file=sys.stderr)
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {(t, k): [] for t in tools for k in ks}
    with tempfile.TemporaryDirectory(prefix="bench-rdzv-agents-") as tmp:
        worker = os.path.join(tmp, "worker.py")
        Path(worker).write_text(WORKER)
        for tool in tools[:2]:  # warm-up: fills the bytecode cache, untimed
            one_run(tool, 2, worker, tmp)
        for rep in range(args.reps):
            for k in ks:
                for tool in tools[rep % len(tools) :] + tools[: rep % len(tools)]:  # rotate the order
                    secs, cpu = (
                        import_floor(k, tmp, FLOORS[tool]) if tool in FLOORS else one_run(tool, k, worker, tmp)[:2]
                    )
                    if secs is not None:
                        runs[tool, k].append((secs, cpu))
                    print(f"  rep {rep} K={k} {tool}: {fmt(secs)} s, CPU {cpu:.2f} s", file=sys.stderr)
        imports = {k: one_run("launcher", k, worker, tmp, importtime=True)[2] for k in ks}
    print(f"# load average after: {os.getloadavg()}", file=sys.stderr)

    def med(tool: str, k: int, i: int) -> float | None:
        return statistics.median(r[i] for r in runs[tool, k]) if runs[tool, k] else None

    print(
        f"\nAgents on one host, c10d: spawn -> every worker running, median of {args.reps} "
        f"(2-core VM, no GPU; network: {NET}; {rev if rev == revision() else f'{rev} at the start, {revision()} at the end'})\n"
    )
    print(
        "| agents | launcher s | torchrun s | torchrun / launcher | floor s | torch floor s | launcher CPU s | torchrun CPU s "
        "| floor CPU s | torch floor CPU s | torch import in each launcher agent s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in ks:
        lo, tr = med("launcher", k, 0), med("torchrun", k, 0)
        ratio = f"{tr / lo:.1f}×" if lo and tr else "n/a"
        imp = f"{statistics.median(imports[k]):.2f}" if imports[k] else "n/a"
        cells = [
            fmt(lo),
            fmt(tr),
            ratio,
            *(fmt(med(t, k, 0)) for t in FLOORS),
            *(fmt(med(t, k, 1)) for t in tools),
            imp,
        ]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(
        "\nfloor: K bare `python -c 'import launcher.cli.run, launcher.rendezvous.c10d'` in parallel, until all imported; "
        "torch floor: the same with `import torch.distributed`. CPU: user+system of the K agents (with their workers) "
        "or K importers, summed."
    )
    print(
        "all runs (s): " + "; ".join(f"{t} K={k}: " + ", ".join(f"{x:.2f}" for x, _ in v) for (t, k), v in runs.items())
    )


if __name__ == "__main__":
    main()
