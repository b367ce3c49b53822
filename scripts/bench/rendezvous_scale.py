"""Rendezvous of N simulated nodes against one TCPStore: the launcher vs torch's own.

Run:  .venv/bin/python scripts/bench/rendezvous_scale.py [--ours 1024,4096,16384] [--torch 64,128,256]
                                                        [--reps 3] [--procs 2] [--cap 45] [--server ours|torch]
(the launcher's rows need `pip install greenlet`: `pip install -e '.[bench]'`)

Per run: one store server on 127.0.0.1 in a process of its own, and --procs runner processes
sharing the N nodes. The launcher's nodes are greenlets (greenhub.py): each runs the real protocol
and our real client over a socket of its own, and a socket call that would block yields to one
edge-triggered epoll per runner; no thread per node, so the harness is not the wall (at 4,096
nodes, threads spent 88 s of CPU against the server's 3.3 s). BENCH_HARNESS=threads brings back
a thread per node. torch's nodes are threads (its client is C++; DESIGN.md's figures: threads in 2
processes). Each runner raises its open-file limit to the hard limit (one connection per node). The launcher's rows use its
own pure-Python server (`launcher.rendezvous.c10d.serve`), or torch's libuv TCPStore server with
`--server torch` (the same wire protocol: a comparison of the servers); torch's rows always use
torch's server and client. Each thread opens its own store client and builds its handler, untimed
("connect s"); then all threads are released together (t0) and each asks for one round:
- launcher: `ElasticRendezvous(TCPStoreAdapter(..), run_id, Node(min=max=N), RendezvousSettings(
  join_timeout=cap)).next_round(Cause.START)` (our pure-Python client); a proxy counts calls at the
  Store interface;
- torch: `DynamicRendezvousHandler.from_backend(run_id, store, C10dRendezvousBackend(store, run_id),
  min_nodes=N, max_nodes=N, timeout=RendezvousTimeout(join=cap)).next_rendezvous()`, torch 2.13
  defaults otherwise; a proxy on the backend's store counts its get / compare_set calls and the
  bytes they carry (the whole state, both ways); the few bootstrap-address ops are not counted.
"rdzv s": t0 to the last thread holding its round (ranks 0..N-1 unique, world size N checked).
A run whose join timeout (--cap) passes is "did not complete", with the operations made by then.
"CPU s": user+system seconds of the runners (the agents) and of the store server, from t0.
Median of --reps for the launcher, one run per N for torch. Runners are killed 120 s after their
start if not yet connected; a runner still going at cap + 10 s prints where its threads are and exits.
Network: by default the script re-runs itself in a private network namespace holding only
loopback (`unshare --net`, root only; `--host-net` opts out): torch's TCPStore asks the resolver
for the name of each peer (PTR 1.0.0.127.in-addr.arpa, both ends of every connection); this VM's
resolver is off-host and loses ~1 query in 25, a 5 s timeout. There they fail at once, locally.
Targets: 1,024 nodes in <= 10 s on this 2-core VM, O(N) store operations per round (shared/DESIGN.md);
16,384 nodes in <= 15 s with store operations per node constant in N (issue 17).
BENCH_PROFILE=FILE runs each runner under cProfile (FILE is overwritten by each; for finding harness costs).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import warnings

from benchlib import Counting, combine, need, private_network, release_together, revision

HERE = os.path.abspath(__file__)
SERVERS = {"ours": "the launcher's pure-Python server", "torch": "torch's libuv server"}
HARNESS = os.environ.get("BENCH_HARNESS", "green")  # the launcher's nodes: "green" (greenlets) or "threads"
NET = "private namespace, loopback only" if os.environ.get("BENCH_NETNS") else "host namespace"


def make(tool: str, i: int, n: int, port: int, cap: float, counts: collections.Counter):
    """Connect one simulated node; return the call that joins a round -> (rank, world size)."""
    if tool == "launcher":
        from launcher.rendezvous.api import Cause
        from launcher.rendezvous.c10d import TCPStoreAdapter
        from launcher.rendezvous.protocol import ElasticRendezvous
        from launcher.rendezvous.records import Node
        from launcher.rendezvous.settings import RendezvousSettings

        store = Counting(TCPStoreAdapter("127.0.0.1", port, timeout=60, connect_timeout=60), counts)
        node = Node(node_id=f"n{i}", addr="127.0.0.1", nproc=1, min_nodes=n, max_nodes=n, max_restarts=0)
        rdzv = ElasticRendezvous(store, "bench", node, RendezvousSettings(join_timeout=cap), port_picker=lambda: 12345)
        return lambda: (lambda r: (r.group_rank, r.world_size))(rdzv.next_round(Cause.START))
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60), use_libuv=True)
    backend = C10dRendezvousBackend(Counting(store, counts, count_bytes=True), "bench")
    handler = DynamicRendezvousHandler.from_backend(
        "bench",
        store,
        backend,
        min_nodes=n,
        max_nodes=n,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=datetime.timedelta(seconds=cap)),
    )
    return lambda: (lambda r: (r.rank, r.world_size))(handler.next_rendezvous())


def green_runner(n: int, lo: int, hi: int, port: int, cap: float) -> dict:
    """The launcher's nodes lo..hi-1 as greenlets of one hub (greenhub.py): each runs the real
    protocol and client over its own real socket; otherwise as `runner`."""
    from greenhub import release_green

    import launcher.tcpstore.client as tcpstore

    m = hi - lo
    counts = [collections.Counter() for _ in range(m)]
    setup = [collections.Counter() for _ in range(m)]

    def prepare(j: int):
        join = make("launcher", lo + j, n, port, cap, counts[j])
        setup[j] = counts[j].copy()
        return join

    out = release_green(m, prepare, [tcpstore])
    total = sum(counts, collections.Counter())
    total.subtract(sum(setup, collections.Counter()))
    return {**out, "counts": {k: v for k, v in total.items() if v}}


def runner(tool: str, n: int, lo: int, hi: int, port: int, cap: float) -> dict:
    """Nodes lo..hi-1 as threads; print "ready" once all are connected, start on a line from stdin."""
    if tool == "launcher" and HARNESS == "green":
        return green_runner(n, lo, hi, port, cap)
    if tool == "torch":
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # no bootstrap store server at rank 0
        quiet_torch()  # once, before the threads
    m = hi - lo
    counts = [collections.Counter() for _ in range(m)]
    setup = [collections.Counter() for _ in range(m)]  # ops before t0 (torch's backend: 1 compare_set)

    def prepare(j: int):
        join = make(tool, lo + j, n, port, cap, counts[j])
        setup[j] = counts[j].copy()
        return join

    out = release_together(m, prepare, nofile=4 * n + 256, give_up_after=cap + 10)
    total = sum(counts, collections.Counter())
    total.subtract(sum(setup, collections.Counter()))
    return {**out, "counts": {k: v for k, v in total.items() if v}}


def quiet_torch() -> None:
    """Import torch.distributed without its NumPy warning or a C++ log line per store wait timeout."""
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.distributed  # noqa: F401


def serve_store(kind: str, nodes: int) -> None:
    """The store server process: print its port, serve until stdin closes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two connections per simulated node
    if kind == "torch":
        quiet_torch()
        from torch.distributed import TCPStore

        server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    else:
        from launcher.rendezvous.c10d import serve

        server = serve("127.0.0.1", 0, nodes)  # told the job's size, as C10dRendezvous does
    print(server.port, flush=True)
    sys.stdin.read()  # until the parent closes the pipe or kills us


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(tool: str, n: int, procs: int, cap: float, server_kind: str) -> dict:
    """One store server, `procs` runners; all killed at the end whatever happens."""
    server = subprocess.Popen(
        [sys.executable, HERE, "--serve", server_kind, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    runs: list[subprocess.Popen] = []
    killer = threading.Timer(120, lambda: [p.kill() for p in runs])  # connecting: 120 s at most
    try:
        port = int(server.stdout.readline())
        bounds = [n * k // procs for k in range(procs + 1)]
        mode = "--profile-run" if os.environ.get("BENCH_PROFILE") else "--run"
        runs += [
            subprocess.Popen(
                [sys.executable, HERE, mode, tool, str(n), str(a), str(b), str(port), str(cap)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for a, b in zip(bounds, bounds[1:])
        ]
        killer.start()
        if any(p.stdout.readline().strip() != "ready" for p in runs):
            return {"ok": False, "error": "a runner failed to connect within 120 s"}
        killer.cancel()
        killer = threading.Timer(cap + 30, lambda: [p.kill() for p in runs])
        killer.start()
        base = cpu_of(server.pid)
        for p in runs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline() or "null") for p in runs]
        server_cpu = cpu_of(server.pid) - base
    finally:
        killer.cancel()
        for p in (*runs, server):
            p.kill()
            p.wait()
    if None in outs:
        return {"ok": False, "error": f"hung: not done {cap + 10:.0f} s after t0 (stacks on stderr)"}
    return {**combine(outs, n), "server_cpu_s": server_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", default="1024,4096,16384")
    ap.add_argument("--torch", default="64,128,256")
    ap.add_argument("--reps", type=int, default=3, help="runs per N for the launcher (torch: 1)")
    ap.add_argument("--procs", type=int, default=2, help="runner processes sharing the N threads")
    ap.add_argument("--cap", type=float, default=45.0, help="join timeout, s")
    ap.add_argument(
        "--server", choices=["ours", "torch"], default="ours", help="the store server of the launcher's rows"
    )
    ap.add_argument("--host-net", action="store_true", help="run in the host network namespace")
    args = ap.parse_args()
    if HARNESS == "green" and args.ours.strip(","):
        need("greenlet", "the launcher's rows (simulated nodes as greenlets)", " (or BENCH_HARNESS=threads)")
    private_network()
    rev = revision()
    print(f"# {datetime.date.today()}  load average before: {os.getloadavg()}; {rev}", file=sys.stderr)
    rows = []
    for tool, sizes, reps in (("launcher", args.ours, args.reps), ("torch", args.torch, 1)):
        for n in (int(x) for x in sizes.split(",") if x):
            runs = [
                measure(tool, n, args.procs, args.cap, args.server if tool == "launcher" else "torch")
                for _ in range(reps)
            ]
            for r in runs:
                print(f"  {tool} N={n}: {json.dumps(r)}", file=sys.stderr)
            rows.append((tool, n, runs))
    print(f"# load average after: {os.getloadavg()}", file=sys.stderr)
    print(
        f"\nRendezvous of N simulated nodes ({'greenlets' if HARNESS == 'green' else 'threads'} in {args.procs} processes for the launcher, "
        f"threads in {args.procs} processes for torch) against one TCPStore server "
        f"(launcher rows: {SERVERS[args.server]}; torch rows: torch's libuv server; 2-core VM, no GPU; network: {NET}; {rev if rev == revision() else f'{rev} at the start, {revision()} at the end'})\n"
    )
    print(
        "| tool | N | ok runs | rdzv s (median) | store ops / round | ops / node | ops by kind | state bytes / node | runner CPU s | server CPU s | connect s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for tool, n, runs in rows:
        good = [r for r in runs if r["ok"]]
        r = sorted(good, key=lambda r: r["rdzv_s"])[len(good) // 2] if good else runs[0]  # the median run
        time_s = f"{statistics.median(g['rdzv_s'] for g in good):.2f}" if good else r["error"]
        c = dict(r.get("counts", {}))
        nbytes = c.pop("bytes", 0)
        ops = sum(c.values())
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))
        print(
            f"| {tool} | {n} | {len(good)}/{len(runs)} | {time_s} | {ops} | {ops / n:.1f} | {kinds} | "
            f"{f'{nbytes / n / 1e6:.2f} MB' if nbytes else '—'} | {r.get('cpu_s', 0):.1f} | {r.get('server_cpu_s', 0):.1f} | {r.get('setup_s', 0):.2f} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_store(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["--run"]:
        tool, n, lo, hi, port, cap = sys.argv[2], *map(int, sys.argv[3:7]), float(sys.argv[7])
        print(json.dumps(runner(tool, n, lo, hi, port, cap)), flush=True)
        os._exit(0)  # torch's heartbeat threads, hundreds of open clients: no orderly teardown needed
    elif sys.argv[1:2] == ["--profile-run"]:  # one runner under cProfile, for finding the harness's costs
        import cProfile

        tool, n, lo, hi, port, cap = sys.argv[2], *map(int, sys.argv[3:7]), float(sys.argv[7])
        profile = cProfile.Profile()
        out = profile.runcall(runner, tool, n, lo, hi, port, cap)
        profile.dump_stats(os.environ.get("BENCH_PROFILE", "/tmp/runner.prof"))
        print(json.dumps(out), flush=True)
        os._exit(0)
    else:
        main()
