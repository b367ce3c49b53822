"""Who should serve the workers' bootstrap store (MASTER_ADDR:MASTER_PORT)? Issue 13, item 10.

torchrun's rank-0 agent serves it (TORCHELASTIC_USE_AGENT_STORE=True: every worker is a client);
the launcher lets worker rank 0 host it (torch's libuv server, in C++, inside that worker) and says
so with TORCHELASTIC_USE_AGENT_STORE=False. An agent-side store would be the launcher's pure-Python
`StoreServer` (the agent does not import torch). This measures both servers, each in a process of its
own, against N real torch TCPStore clients (threads in --procs processes) doing what
`init_process_group` does at start-up:

    nccl: connect (validate, ping), add the init key, rank 0 sets the unique id, every rank gets it
    gloo: the same, then each rank sets its address and reads every other rank's (a full mesh, N^2)

and reports the wall time from "go" to the last rank done, the server's CPU seconds and its RSS.

    python scripts/bench/bootstrap_store.py --ranks 256 1024 4096 --pattern nccl
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SERVERS = {
    "torch-libuv (worker rank 0, today)": "import torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, use_libuv=True)\nport = s.port\n",
    "launcher StoreServer (agent)": "from launcher.tcpstore import StoreServer\n"
    "s = StoreServer('127.0.0.1', 0)\nport = s.port\n",
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


def proc_stats(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return cpu, rss * 1024


def measure(server_code: str, world: int, procs: int, pattern: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    server = subprocess.Popen(
        [sys.executable, "-c", server_code + SERVER_TAIL],
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
                    CLIENT,
                    str(port),
                    str(world),
                    str(first),
                    str(min(per, world - first)),
                    pattern,
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
    for c in clients:
        end, nerr, _ = c.stdout.readline().split(" ", 2)
        ends.append(float(end))
        errors += int(nerr)
        c.wait()
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
    p.add_argument("--pattern", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--repeat", type=int, default=3, help="runs per server and size (min, median, max reported)")
    args = p.parse_args()
    print(
        f"# {args.pattern} bootstrap, {args.procs} client processes, {args.repeat} runs each; loadavg {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'ranks':>6}  {'server':<36} {'wall s: min':>11} {'median':>7} {'max':>7} {'srv cpu s':>9} {'srv rss MiB':>11} {'errors':>6}"
    )
    for world in args.ranks:
        for name, code in SERVERS.items():
            runs = [measure(code, world, args.procs, args.pattern) for _ in range(args.repeat)]
            walls = sorted(r["wall_s"] for r in runs)
            median = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
            print(
                f"{world:>6}  {name:<36} {walls[0]:>11.3f} {median['wall_s']:>7.3f} {walls[-1]:>7.3f} "
                f"{median['server_cpu_s']:>9.2f} {median['server_rss_mib']:>11.1f} {sum(r['errors'] for r in runs):>6}",
                flush=True,
            )


if __name__ == "__main__":
    main()
