"""The etcd rendezvous: 4 agents start -> all workers running, 1,024 simulated nodes, a node's death,
an agent's peak memory.

Run:  .venv/bin/python scripts/bench/etcd_rendezvous.py [--parts agents,scale,death,rss] [--reps 5]
                                                        [--nodes 64,256,1024] [--procs 2] [--clients 8]
                                                        [--engine gateway|grpc]

The script starts its own etcd (Debian's etcd-server, etcd's default timings, a throwaway data
folder, loopback ports) and stops it at the end. Four parts, each printed as a markdown table:

- agents: K=4 launcher processes started at once (Popen one after the other, no waiting) with
  `--nnodes 4 --nproc_per_node 1 --rdzv_backend etcd --rdzv_endpoint 127.0.0.1:PORT --rdzv_id <fresh>`;
  the worker writes time.time() as its first statement. Metric: max(worker start) - time.time()
  just before the first Popen. Beside it, torchrun 2.13 with c10d (torchrun's etcd backends need
  etcd's v2 API, off since etcd 3.4) and the floor: K bare `python -c "import <what the agent
  imports>"` started together until all exit (launcher.cli.run and the etcd backend with its engine:
  the JSON gateway's by default, pyetcd with --engine grpc). Bytecode caching on for every
  process (PYTHONPYCACHEPREFIX), filled by an untimed warm-up run. Target (shared/DESIGN.md): <= 0.5 s.
- scale: N simulated nodes = threads in --procs runner processes; each thread builds
  `ElasticRendezvous(EtcdStore(..), run_id, Node(min=max=N), RendezvousSettings(join_timeout=cap))`
  untimed, then all are released together and each calls `next_round(Cause.START)` once.
  The threads of a runner share --clients etcd clients (round robin) and each client's lease, as
  the gRPC engine needed (a gRPC channel has its own threads, and 1,024 of them in two Python
  processes would measure gRPC's thread overhead, not the protocol). --engine picks the engine:
  gateway (the default; a client is a pool of keep-alive HTTP connections, each watch a stream of
  its own, read by the waiting thread) or grpc (pyetcd). Every simulated node still has its own
  EtcdStore (its own watches) and signs in (`EtcdStore.sign_in`) and holds its alive key as an
  agent does. Counted: calls at the Store interface and requests sent to etcd, per node.
  "rdzv s": release to the last node holding its round (ranks 0..N-1 unique, world size N checked).
  Target: 1,024 nodes in <= 10 s on this 2-core VM, O(N) operations per round; 4,096 in <= 15 s (issue 17).
  BENCH_HARNESS=green (gateway engine; `pip install greenlet`): the nodes are greenlets of one
  hub per runner (greenhub.py) instead of threads, the real protocol and gateway client on real
  sockets; the 8 leases per runner are refreshed by hub tasks, with a 10 s TTL (a runner's one
  thread serves thousands of nodes; a 2 s lease could lapse behind them, which an agent's own
  refresher never sees). BENCH_ETCD_FLAGS: extra flags for the benchmark's etcd (e.g.
  `--enable-pprof`, with `--host-net`, to read etcd's /debug/pprof while a round forms).
- death: 3 agents, `--nnodes 2:3`, each in its own session. Once the 3 workers of round 0 run, one
  agent is lost, three ways (`DEATHS`): its whole session SIGKILLed (agent, guard and worker: a host
  going away, seen when its lease lapses: the default keep_alive_interval 0.5 s x 12 attempts, a 6 s
  lease), the agent alone SIGKILLed (a crash: its guard revokes the lease at once), and the whole
  session again with `--rdzv_conf keep_alive_max_attempt=4` (a 2 s lease). Metric: kill -> both
  survivors' round-1 workers running (their first statement's time.time()). Target: <= 3 s.
- rss: 2 agents (`--nnodes 2`) on etcd, each run through a tiny wrapper whose atexit hook reads the
  agent's VmHWM (peak resident memory, all threads, no children) and CPU time (user + system) from
  /proc/self, as launch_overhead.py does. Largest RSS, smallest CPU over --reps x 2 agents.
  Target: <= 30 MiB.

Median of --reps. Every process group the script starts is SIGKILLed at the end of its run, every
wait is capped. By default the script re-runs itself in a private network namespace holding only
loopback (`unshare --net`, root only; `--host-net` opts out), as the other rendezvous benchmarks do
(torchrun's TCPStore asks this VM's off-host resolver for reverse names).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import Counting, combine, etcd_member, free_port, need, private_network, release_together, revision

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.etcd import Member  # support/ (tests/) is on sys.path only once etcd_member ran

HERE = os.path.abspath(__file__)
ROOT = str(Path(HERE).parents[2])
PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))
HARNESS = os.environ.get(
    "BENCH_HARNESS", "threads"
)  # the simulated nodes: "threads" or "green" (greenlets, greenhub.py)
NET = "private namespace, loopback only" if os.environ.get("BENCH_NETNS") else "host namespace"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "launcher-bench-pycache")
ENV["PYTHONPATH"] = os.pathsep.join(
    filter(None, [ROOT, os.environ.get("PYTHONPATH", "")])
)  # greenlet may be installed beside
CAP = 60.0
RUN_LAUNCHER = """import runpy, sys
sys.argv[0] = "launcher"
runpy.run_module("launcher", run_name="__main__", alter_sys=True)
"""
WORKER = """import os, sys, time
t = time.time()
path = os.path.join(sys.argv[1], f"{os.getpid()}.start")
with open(path + ".tmp", "w") as f:
    f.write(f"{t!r} {os.environ.get('LAUNCHER_ROUND', '0')}")
os.rename(path + ".tmp", path)  # whole or absent: the bench polls these files
time.sleep(float(sys.argv[2]))
"""


# ---------------------------------------------------------------------------- processes


def start(cmd: list[str], log: str) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=ENV, stdout=f, stderr=f, start_new_session=True)


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def starts(folder: str) -> list[tuple[float, int]]:
    """(time, round) of every worker that started, from the files it wrote."""
    out = []
    for f in Path(folder).glob("*.start"):
        t, r = f.read_text().split()
        out.append((float(t), int(r)))
    return out


def wait_for(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def agent_cmd(
    tool: str, k: int, endpoint: str, run_id: str, worker: str, out: str, sleep: float, nnodes: str = "", conf: str = ""
) -> list[str]:
    if tool == "torchrun":
        rdzv = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{endpoint}", "--rdzv_id", run_id]
        head = [TORCHRUN]
    else:
        rdzv = ["--rdzv_backend", "etcd", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id, *engine_conf(conf)]
        head = [PY, "-m", "launcher"]
    return head + ["--nnodes", nnodes or str(k), "--nproc_per_node", "1", *rdzv, worker, out, str(sleep)]


def engine_conf(conf: str = "") -> list[str]:
    """The agents' --rdzv_conf: `conf`, and engine=grpc for --engine grpc (the opt-in gRPC engine)."""
    joined = ",".join(filter(None, ["engine=grpc" if ENGINE == "grpc" else "", conf]))
    return ["--rdzv_conf", joined] if joined else []


def tail(logs: list[str]) -> str:
    return "".join("\n    | " + line for p in logs for line in Path(p).read_text().splitlines()[-3:])


# ---------------------------------------------------------------------------- part 1: agents


def agents_run(tool: str, k: int, etcd: Member, worker: str, tmp: str) -> float | None:
    out = tempfile.mkdtemp(dir=tmp, prefix=f"{tool}-")
    endpoint = str(free_port()) if tool == "torchrun" else etcd.endpoint
    run_id = os.path.basename(out)
    logs = [os.path.join(out, f"agent{i}.log") for i in range(k)]
    procs: list[subprocess.Popen] = []
    t0 = time.time()
    try:
        for log in logs:
            procs.append(start(agent_cmd(tool, k, endpoint, run_id, worker, out, 0.5), log))
        for p in procs:
            try:
                p.wait(max(0.1, t0 + CAP - time.time()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        kill_all(procs)
    seen = starts(out)
    if len(seen) != k or any(p.returncode != 0 for p in procs):
        print(f"  {tool}: FAILED ({len(seen)}/{k} workers started){tail(logs)}", file=sys.stderr)
        return None
    return max(t for t, _ in seen) - t0


ENGINE = "gateway"  # --engine


def agent_imports() -> str:
    """What an etcd agent imports beyond the interpreter: the launcher, the backend, its engine."""
    engine = "launcher.rendezvous.etcd.grpc_engine" if ENGINE == "grpc" else "launcher.rendezvous.etcd.gateway"
    return f"launcher.cli.run, launcher.rendezvous.etcd.backend, {engine}"


def import_floor(k: int) -> float:
    t = time.perf_counter()
    procs = [subprocess.Popen([PY, "-c", f"import {agent_imports()}"], env=ENV) for _ in range(k)]
    for p in procs:
        p.wait(CAP)
    return time.perf_counter() - t


def part_agents(etcd: Member, reps: int, tmp: str, worker: str) -> None:
    k, tools = 4, ["launcher", "torchrun"]
    for tool in tools:  # warm-up: fills the bytecode cache, untimed
        agents_run(tool, k, etcd, worker, tmp)
    times: dict[str, list[float]] = {t: [] for t in tools}
    floors = []
    for rep in range(reps):
        for tool in tools if rep % 2 == 0 else tools[::-1]:
            s = agents_run(tool, k, etcd, worker, tmp)
            if s is not None:
                times[tool].append(s)
            print(f"  agents rep {rep} {tool}: {fmt(s)} s", file=sys.stderr)
        floors.append(import_floor(k))
    lo, tr = med(times["launcher"]), med(times["torchrun"])
    print(f"\n4 agents on one host, start -> all workers running (median of {reps}; network: {NET})\n")
    print(
        f"| agents | launcher, etcd s | torchrun 2.13, c10d s | torchrun / launcher | floor s (4 × `import {agent_imports()}` in parallel) | target |"
    )
    print("|---|---|---|---|---|---|")
    ratio = f"{tr / lo:.1f}×" if lo and tr else "n/a"
    print(f"| {k} | {fmt(lo)} | {fmt(tr)} | {ratio} | {med(floors):.2f} | ≤ 0.5 s |")
    print("\nall runs (s): " + "; ".join(f"{t}: " + ", ".join(f"{x:.2f}" for x in v) for t, v in times.items()))


# ---------------------------------------------------------------------------- part 2: scale


def runner(endpoint: str, n: int, lo: int, hi: int, clients: int, cap: float, run_id: str, engine: str) -> dict:
    """Nodes lo..hi-1 as threads (or greenlets: BENCH_HARNESS=green, gateway engine only); print
    "ready" once all are built, start on a line from stdin."""
    from launcher.rendezvous.api import Cause
    from launcher.rendezvous.etcd.lease import Lease
    from launcher.rendezvous.etcd.settings import EtcdOptions
    from launcher.rendezvous.etcd.store import EtcdStore, _Client
    from launcher.rendezvous.protocol import ElasticRendezvous
    from launcher.rendezvous.records import Node
    from launcher.rendezvous.settings import RendezvousSettings

    host, port = endpoint.split(":")
    opts = EtcdOptions(endpoints=((host, int(port)),), engine=engine)
    settings = RendezvousSettings(join_timeout=cap)
    shared = [_Client(opts) for _ in range(clients)]
    green = HARNESS == "green" and engine == "gateway"
    # Green: a runner's one thread serves its thousands of nodes and their 8 leases' keep-alives; a
    # 10 s lease keeps a busy hub from losing a lease (an agent refreshes its own, unhindered).
    leases = [Lease(opts, 10, 1.0) if green else Lease(opts, 2, 0.5) for _ in range(clients)]
    if green:
        from greenhub import release_green

        import launcher.rendezvous.etcd.gateway as gateway_mod
        import launcher.rendezvous.etcd.http1 as http1_mod
        import launcher.rendezvous.etcd.store as etcd_mod

    def keep_alive(hub, finished):
        """The leases' refreshers as hub tasks (Lease.start's thread would block the hub's thread)."""

        def refresh(lease):
            while not finished():
                try:
                    lease._refresh()
                except Exception as e:  # a slow answer: the next one may do (as Lease._run)
                    print(f"    lease keep-alive: {e}", file=sys.stderr, flush=True)
                hub.wait(None, 0, lease.interval)

        return [lambda lease=lease: refresh(lease) for lease in leases]

    def grant(c, lease) -> None:  # green: without its thread (`keep_alive` refreshes it), inside the hub
        lease.store = EtcdStore(opts, retry_for=lease.ttl, client=c.sibling(max(1.0, lease.ttl / 2)), owns_client=True)
        lease.id = EtcdStore(opts, lease, client=c)._call(lambda e: e.lease_grant(lease.ttl), retry_for=30)

    if not green:
        for c, lease in zip(shared, leases):
            lease.start(EtcdStore(opts, lease, client=c), retry_for=30)
    m = hi - lo
    counts = [collections.Counter() for _ in range(m)]
    stores: list = [None] * m

    def prepare(j: int):
        i = lo + j
        if green and j < clients:
            grant(shared[j], leases[j])
        store = stores[j] = EtcdStore(opts, leases[j % clients], client=shared[j % clients])
        node = Node(node_id=f"n{i}", addr="127.0.0.1", nproc=1, min_nodes=n, max_nodes=n, max_restarts=0)
        rdzv = ElasticRendezvous(Counting(store, counts[j]), run_id, node, settings, port_picker=lambda: 12345)

        def join():
            store.sign_in(run_id, f"n{i}", 30)  # as an agent does
            r = rdzv.next_round(Cause.START)
            return r.group_rank, r.world_size

        return join

    if green:
        out = release_green(m, prepare, [etcd_mod, gateway_mod, http1_mod], background=keep_alive)
    else:
        out = release_together(m, prepare, nofile=4 * n + 256)
    return {
        **out,
        "counts": dict(sum(counts, collections.Counter())),
        "rpcs": sum(s.rpcs for s in stores if s is not None),
    }


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scale_run(etcd: Member, n: int, procs: int, clients: int, cap: float) -> dict:
    run_id = f"scale-{n}-{os.urandom(3).hex()}"
    runs: list[subprocess.Popen] = []
    killer = threading.Timer(cap + 30, lambda: [p.kill() for p in runs])
    try:
        bounds = [n * k // procs for k in range(procs + 1)]
        runs += [
            subprocess.Popen(
                [PY, HERE, "--run", etcd.endpoint, str(n), str(a), str(b), str(clients), str(cap), run_id, ENGINE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=ENV,
            )
            for a, b in zip(bounds, bounds[1:])
        ]
        killer.start()
        if any(p.stdout.readline().strip() != "ready" for p in runs):
            return {"ok": False, "error": "a runner failed to start"}
        base = cpu_of(etcd.proc.pid)
        for p in runs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline() or "null") for p in runs]
        etcd_cpu = cpu_of(etcd.proc.pid) - base
    finally:
        killer.cancel()
        for p in runs:
            p.kill()
            p.wait()
    if None in outs:
        return {"ok": False, "error": f"runners killed after {cap + 30:.0f} s"}
    return {**combine(outs, n), "rpcs": sum(o["rpcs"] for o in outs), "etcd_cpu_s": etcd_cpu}


def part_scale(etcd: Member, ns: list[int], reps: int, procs: int, clients: int, cap: float) -> None:
    rows = []
    for n in ns:
        runs = []
        for rep in range(reps):
            r = scale_run(etcd, n, procs, clients, cap)
            runs.append(r)
            print(f"  scale N={n} rep {rep}: " + (f"{r['rdzv_s']:.2f} s" if r["ok"] else r["error"]), file=sys.stderr)
        good = [r for r in runs if r["ok"]]
        rows.append((n, good, runs))
    print(
        f"\nRendezvous of N simulated nodes on etcd ({ENGINE} engine; {'greenlets' if HARNESS == 'green' else 'threads'} in {procs} processes, {clients} clients each; "
        f"median of {reps}; network: {NET})\n"
    )
    print(
        "| nodes | rdzv s | Store calls / node | etcd requests / node | runners CPU s | etcd CPU s | build s (untimed) | completed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n, good, runs in rows:
        if not good:
            print(f"| {n} | failed: {runs[-1]['error']} | | | | | | 0/{len(runs)} |")
            continue
        pick = sorted(good, key=lambda r: r["rdzv_s"])[len(good) // 2]
        calls = sum(pick["counts"].values()) / n
        print(
            f"| {n} | {pick['rdzv_s']:.2f} | {calls:.1f} | {pick['rpcs'] / n:.1f} | {pick['cpu_s']:.1f} | "
            f"{pick['etcd_cpu_s']:.1f} | {pick['setup_s']:.1f} | {len(good)}/{len(runs)} |"
        )
    for n, good, _ in rows:
        if good:
            pick = sorted(good, key=lambda r: r["rdzv_s"])[len(good) // 2]
            per = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(pick["counts"].items()))
            print(f"\nN={n}, Store calls per node by method: {per}")


# ---------------------------------------------------------------------------- part 3: death


# What is lost, SIGKILLed: "host" the agent's whole session (agent, guard and worker: a host going away; its
# lease lapses), "agent" the agent alone (a crash: its guard revokes its lease and ends its worker).
DEATHS = (
    ("a host lost whole", "host", ""),
    ("the agent alone (its guard revokes the lease)", "agent", ""),
    ("a host lost whole, keep_alive_max_attempt=4", "host", "keep_alive_max_attempt=4"),
)


def death_run(etcd: Member, worker: str, tmp: str, kill: str = "host", conf: str = "") -> float | None:
    out = tempfile.mkdtemp(dir=tmp, prefix="death-")
    run_id = os.path.basename(out)
    logs = [os.path.join(out, f"agent{i}.log") for i in range(3)]
    cmd = agent_cmd("launcher", 3, etcd.endpoint, run_id, worker, out, 30, nnodes="2:3", conf=conf)
    procs = [start(cmd, log) for log in logs]
    try:
        if not wait_for(lambda: len(starts(out)) >= 3, CAP):
            print(f"  death: round 0 never ran{tail(logs)}", file=sys.stderr)
            return None
        time.sleep(1.0)  # let the round settle: every lease refreshed, every watch open
        t_kill = time.time()
        if kill == "host":
            os.killpg(procs[0].pid, signal.SIGKILL)
        else:
            os.kill(procs[0].pid, signal.SIGKILL)
        if not wait_for(lambda: sum(1 for _, r in starts(out) if r >= 1) >= 2, CAP):
            print(f"  death: survivors never re-formed{tail(logs)}", file=sys.stderr)
            return None
        return max(t for t, r in starts(out) if r >= 1) - t_kill
    finally:
        kill_all(procs)


def part_death(etcd: Member, reps: int, tmp: str, worker: str) -> None:
    from launcher.rendezvous.etcd.lease import lease_ttl
    from launcher.rendezvous.settings import RendezvousSettings

    rows = []
    for what, kill, conf in DEATHS:
        times = []
        for rep in range(reps):
            s = death_run(etcd, worker, tmp, kill, conf)
            print(f"  death ({what}) rep {rep}: {fmt(s)} s", file=sys.stderr)
            if s is not None:
                times.append(s)
        rows.append((what, times))
    ttl = lease_ttl(RendezvousSettings())
    print(
        f"\nA remote node dies -> survivors running again in a new round (3 agents, --nnodes 2:3; the default "
        f"lease: {ttl} s; median of {reps}; network: {NET})\n"
    )
    print("| what is SIGKILLed | launcher, etcd s | min s | max s | torchrun 2.13 | target |")
    print("|---|---|---|---|---|---|")
    for what, times in rows:
        low, high = (min(times), max(times)) if times else (None, None)
        print(
            f"| {what} | {fmt(med(times))} | {fmt(low)} | {fmt(high)} "
            f"| never (the survivors wait for an NCCL/gloo timeout; pytorch#111646) | ≤ 3 s |"
        )
    for what, times in rows:
        print(f"\nall runs, {what} (s): " + ", ".join(f"{x:.2f}" for x in times))


# ---------------------------------------------------------------------------- part 4: rss


RSS_WRAPPER = (
    r"""
import atexit, json, os, sys
out = sys.argv.pop(1)

def dump():
    rss = sum(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    mods = sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "pyetcd", "google", "torch"))
    json.dump({"rss_kib": rss, "cpu_s": os.times().user + os.times().system, "heavy": mods[:5]}, open(out, "w"))

atexit.register(dump)  # registered first, so it runs last: at the agent's exit
"""
    + RUN_LAUNCHER
)


def rss_run(etcd: Member, worker: str, tmp: str, wrapper: str) -> list[dict] | None:
    out = tempfile.mkdtemp(dir=tmp, prefix="rss-")
    run_id = os.path.basename(out)
    logs = [os.path.join(out, f"agent{i}.log") for i in range(2)]
    stats = [os.path.join(out, f"agent{i}.json") for i in range(2)]
    rdzv = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "etcd",
        "--rdzv_endpoint",
        etcd.endpoint,
        "--rdzv_id",
        run_id,
        *engine_conf(),
        worker,
        out,
        "0.5",
    ]
    procs = [start([PY, wrapper, st, *rdzv], log) for st, log in zip(stats, logs)]
    try:
        for p in procs:
            p.wait(CAP)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_all(procs)
    if any(p.returncode != 0 for p in procs) or not all(os.path.exists(st) for st in stats):
        print(f"  rss: FAILED{tail(logs)}", file=sys.stderr)
        return None
    return [json.loads(Path(st).read_text()) for st in stats]


def part_rss(etcd: Member, reps: int, tmp: str, worker: str) -> None:
    wrapper = os.path.join(tmp, "rss_wrapper.py")
    Path(wrapper).write_text(RSS_WRAPPER)
    rss_run(etcd, worker, tmp, wrapper)  # warm-up: the bytecode cache
    runs = [a for _ in range(reps) for a in (rss_run(etcd, worker, tmp, wrapper) or [])]
    print(
        f"\nAgent peak RSS on etcd ({ENGINE} engine; 2 agents, --nnodes 2, {len(runs)} agent runs; VmHWM of the agent "
        f"process at its exit, all threads, no children)\n"
    )
    print("| agent peak RSS MiB (largest) | agent CPU s (smallest) | grpc/protobuf/torch loaded | target |")
    print("|---|---|---|---|")
    if not runs:
        print("| failed | | | ≤ 30 MiB |")
        return
    heavy = sorted({m for r in runs for m in r["heavy"]})
    print(
        f"| {max(r['rss_kib'] for r in runs) / 1024:.1f} | {min(r['cpu_s'] for r in runs):.3f} | "
        f"{', '.join(heavy) or 'none'} | ≤ 30 MiB |"
    )


# ---------------------------------------------------------------------------- main


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None) -> str:
    return "failed" if x is None else f"{x:.2f}"


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        endpoint, n, lo, hi, clients, cap, run_id, engine = sys.argv[2:10]
        print(
            json.dumps(runner(endpoint, int(n), int(lo), int(hi), int(clients), float(cap), run_id, engine)), flush=True
        )
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="agents,scale,death,rss")
    ap.add_argument(
        "--engine",
        choices=("gateway", "grpc"),
        default="gateway",
        help="the etcd engine the agents and simulated nodes use (grpc: --rdzv_conf engine=grpc, pyetcd)",
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nodes", default="64,256,1024", help="scale: simulated node counts")
    ap.add_argument("--scale-reps", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2, help="scale: runner processes sharing the N threads")
    ap.add_argument("--clients", type=int, default=8, help="scale: etcd connections per runner process")
    ap.add_argument("--cap", type=float, default=60.0, help="scale: join timeout, s")
    ap.add_argument("--host-net", action="store_true", help="run in the host network namespace")
    args = ap.parse_args()
    global ENGINE
    ENGINE = args.engine
    if not shutil.which("etcd"):
        raise SystemExit("no etcd binary on PATH (Debian: apt-get install etcd-server)")
    if HARNESS == "green" and ENGINE == "gateway" and "scale" in args.parts.split(","):
        need("greenlet", "BENCH_HARNESS=green (simulated nodes as greenlets)", " (or BENCH_HARNESS=threads)")
    private_network()
    parts = args.parts.split(",")
    print(
        f"# {datetime.datetime.now():%Y-%m-%d %H:%M}  {revision()}, {ENGINE} engine; load average before: {os.getloadavg()}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="bench-etcd-") as tmp:
        worker = os.path.join(tmp, "worker.py")
        Path(worker).write_text(WORKER)
        etcd = etcd_member(tmp)
        try:
            if "agents" in parts:
                part_agents(etcd, args.reps, tmp, worker)
            if "scale" in parts:
                part_scale(
                    etcd, [int(x) for x in args.nodes.split(",")], args.scale_reps, args.procs, args.clients, args.cap
                )
            if "death" in parts:
                part_death(etcd, args.reps, tmp, worker)
            if "rss" in parts:
                part_rss(etcd, args.reps, tmp, worker)
        finally:
            etcd.stop()
    print(f"# load average after: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
