"""Who should serve the workers' bootstrap store (MASTER_ADDR:MASTER_PORT)? Issue 13, item 10.

torchrun's rank-0 agent serves it (TORCHELASTIC_USE_AGENT_STORE=True: every worker is a client);
the launcher lets worker rank 0 host it (torch's libuv server, in C++, inside that worker) and says
so with TORCHELASTIC_USE_AGENT_STORE=False. An agent-side store would be the launcher's pure-Python
`StoreServer` (the agent does not import torch). This measures both servers, each in a process of its
own, against N real torch TCPStore clients (threads in --procs processes) doing what
`init_process_group` does at start-up:

    nccl: connect (validate, ping), add the init key, rank 0 sets the unique id, every rank gets it
    init: the same with init_process_group's store-based barrier first (each rank adds itself; the
          last one in sets the barrier's key, which every rank waits for)
    gloo: the nccl steps, then each rank sets its address and reads every other rank's (a full mesh, N^2)

and reports the wall time from "go" to the last rank done, the server's CPU seconds and its RSS.
The ranks are greenlets of one hub per client process (greenhub.py; `--harness threads`: a thread
each). Network: the script re-runs itself in a private network namespace holding only loopback
(benchlib.private_network; root only, `--host-net` opts out): torch's server asks the resolver for
the name of each peer, and this VM's off-host resolver makes that ~0.1 s per connection, serialized.

    python scripts/bench/bootstrap_store.py --ranks 256 1024 4096 --pattern nccl
    python scripts/bench/bootstrap_store.py --ranks 16384 --pattern init --procs 8 --repeat 1
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from benchlib import need, private_network  # noqa: E402

SERVERS = {
    "torch-libuv (worker rank 0, today)": "import torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, use_libuv=True)\nport = s.port\n",
    "launcher StoreServer (agent)": "from launcher.tcpstore import StoreServer\n"
    "s = StoreServer('127.0.0.1', 0, expect=WORLD)\nport = s.port\n",  # expect: as bootstrap.py
}
SERVER_TAIL = "import sys, resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)\nprint(port, flush=True)\nsys.stdin.read()\n"

CLIENT = r"""
import sys, threading, time, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
from launcher.tcpstore import StoreClient
port, world, first, count, pattern = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ends, errors = [], []
def rank(r):
    try:
        s = StoreClient("127.0.0.1", port, timeout=300)  # VALIDATE and PING, as torch's client
        s.add("init/", 1)  # what torch's client constructor does with world_size
        if pattern == "init" and s.add("barrier/", 1) == world:  # the store-based barrier: the last sets the key
            s.set("barrier/last", b"1")
        if pattern == "init":
            s.get("barrier/last")  # every rank waits for the last one
        if r == 0:
            s.set("uid", b"x" * 128)
        s.get("uid")
        if pattern == "gloo":
            s.set(f"addr/{r}", b"y" * 64)
            for peer in range(world):
                s.get(f"addr/{peer}")
        ends.append(time.time())
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=rank, args=(r,)) for r in range(first, first + count)]
print("ready", flush=True)
sys.stdin.readline()
for t in threads: t.start()
for t in threads: t.join()
print(max(ends) if ends else 0, len(errors), errors[:1], flush=True)
"""


# The same ranks as greenlets of one hub per process (greenhub.py): thousands of ranks without a
# GIL convoy of thousands of threads, so the client side costs what the protocol costs.
CLIENT_GREEN = r"""
import sys, time, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
sys.path.insert(0, sys.argv[6])
from greenhub import release_green
import launcher.tcpstore.client as client_module
from launcher.tcpstore import StoreClient
port, world, first, count, pattern = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
kept = []
def prepare(j):
    r = first + j
    def rank():
        s = StoreClient("127.0.0.1", port, timeout=600)
        kept.append(s)  # a worker keeps its store connection
        s.add("init/", 1)
        if pattern == "init" and s.add("barrier/", 1) == world:
            s.set("barrier/last", b"1")
        if pattern == "init":
            s.get("barrier/last")
        if r == 0:
            s.set("uid", b"x" * 128)
        s.get("uid")
        if pattern == "gloo":
            s.set(f"addr/{r}", b"y" * 64)
            for peer in range(world):
                s.get(f"addr/{peer}")
        return r
    return rank
out = release_green(count, prepare, [client_module])
ends = [t for _, t in out["done"]]
print(max(ends) if ends else 0, len(out["errors"]), out["errors"][:1], flush=True)
"""


def proc_stats(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return cpu, rss * 1024


def measure(server_code: str, world: int, procs: int, pattern: str, limit: float, harness: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    server = subprocess.Popen(
        [sys.executable, "-c", server_code.replace("WORLD", str(world)) + SERVER_TAIL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )  # libuv warns per peer
    port = int(server.stdout.readline())
    cpu0, rss0 = proc_stats(server.pid)
    per = -(-world // procs)
    clients = []
    for first in range(0, world, per):
        clients.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CLIENT_GREEN if harness == "green" else CLIENT,
                    str(port),
                    str(world),
                    str(first),
                    str(min(per, world - first)),
                    pattern,
                    HERE,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    for c in clients:
        assert c.stdout.readline().strip() == "ready"
    go = time.time()
    for c in clients:
        c.stdin.write("go\n")
        c.stdin.flush()
    ends, errors = [], 0
    try:
        for c in clients:
            left = max(0.1, go + limit - time.time())
            ready = select.select([c.stdout], [], [], left)[0]
            if not ready:
                raise TimeoutError
            end, nerr, _ = c.stdout.readline().split(" ", 2)
            ends.append(float(end))
            errors += int(nerr)
            c.wait()
    except TimeoutError:  # past --limit: the run is reported as such, and everything stopped
        cpu1, rss1 = proc_stats(server.pid)
        for c in clients:
            c.kill()
            c.wait()
        server.kill()
        server.wait()
        return {
            "wall_s": float("inf"),
            "server_cpu_s": cpu1 - cpu0,
            "server_rss_mib": rss1 / 2**20,
            "server_rss_growth_mib": (rss1 - rss0) / 2**20,
            "errors": 0,
        }
    cpu1, rss1 = proc_stats(server.pid)
    server.stdin.close()
    server.wait()
    return {
        "wall_s": max(ends) - go,
        "server_cpu_s": cpu1 - cpu0,
        "server_rss_mib": rss1 / 2**20,
        "server_rss_growth_mib": (rss1 - rss0) / 2**20,
        "errors": errors,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--procs", type=int, default=8, help="client processes (threads share them)")
    p.add_argument("--pattern", choices=("nccl", "init", "gloo"), default="nccl")
    p.add_argument("--repeat", type=int, default=3, help="runs per server and size (min, median, max reported)")
    p.add_argument("--limit", type=float, default=600.0, help="seconds a run may take (past it: inf)")
    p.add_argument("--servers", nargs="+", choices=("torch", "launcher"), default=["torch", "launcher"])
    p.add_argument(
        "--harness",
        choices=("green", "threads"),
        default="green",
        help="ranks as greenlets (pip install greenlet) or threads",
    )
    p.add_argument("--host-net", action="store_true", help="run in the host network namespace")
    args = p.parse_args()
    if args.harness == "green":
        need("greenlet", "--harness green (ranks as greenlets)", " (or --harness threads)")
    private_network()
    print(
        f"# {args.pattern} bootstrap, {args.procs} client processes ({args.harness}), {args.repeat} runs each; "
        f"loadavg {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'ranks':>6}  {'server':<36} {'wall s: min':>11} {'median':>7} {'max':>7} {'srv cpu s':>9} {'srv rss MiB':>11} {'errors':>6}"
    )
    for world in args.ranks:
        for name, code in SERVERS.items():
            if name.split("-")[0].split(" ")[0] not in args.servers:
                continue
            runs = [
                measure(code, world, args.procs, args.pattern, args.limit, args.harness) for _ in range(args.repeat)
            ]
            walls = sorted(r["wall_s"] for r in runs)
            median = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
            print(
                f"{world:>6}  {name:<36} {walls[0]:>11.3f} {median['wall_s']:>7.3f} {walls[-1]:>7.3f} "
                f"{median['server_cpu_s']:>9.2f} {median['server_rss_mib']:>11.1f} {sum(r['errors'] for r in runs):>6}",
                flush=True,
            )


if __name__ == "__main__":
    main()
