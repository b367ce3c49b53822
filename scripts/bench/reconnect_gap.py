"""How long a store session goes without a connection when its agent's connections are cut: what
the server's lease (`tcpstore.GRACE`, 5 s since issue 32; 0.1 s before) must cover for a reconnect
to be no death.

Run (root: `ss -K` kills sockets):  .venv/bin/python scripts/bench/reconnect_gap.py [--secs 15] [--busy 0]

One `StoreServer` in this process, 3 simulated agents in processes of their own, each as the c10d
backend connects (a `TCPStoreAdapter`, which reconnects, and its clone): the main connection holds
`alive<i>`, the watcher's bumps a heartbeat and waits in WAIT_CHANGE on its neighbour's, as an
agent's watcher does. Every 0.2 s `ss -K` kills every connection to the server (the agents' ends:
their kernel resets them, as a crash of the network path would). The server records, per session,
the time from its last connection closing to a connection rejoining it (grace set to 10 s here, so
nothing is deleted meanwhile). `--busy N` runs N busy loops meanwhile (a loaded host).
Prints the number of gaps, their median, p90, p99 and max. Reports only, asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from launcher.tcpstore import StoreServer

AGENT = """
import sys, threading, time
from launcher.rendezvous.c10d import TCPStoreAdapter
main = TCPStoreAdapter("127.0.0.1", int(sys.argv[1]), 60)
me, right = sys.argv[2], (int(sys.argv[2]) + 1) % 3
main.hold(f"alive{me}")
def watch():
    w = main.clone()
    while True:
        w.add(f"hb{me}", 1)
        w.wait_change("change", f"alive{right}", 0.5)
threading.Thread(target=watch, daemon=True).start()
time.sleep(float(sys.argv[3]))
"""


class Timed(StoreServer):
    """A StoreServer that records how long each session was without a connection."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.left_at: dict[int, float] = {}
        super().__init__("127.0.0.1", 0, grace=10.0)

    def _leave_session(self, c) -> None:
        session = c.session
        super()._leave_session(c)
        if session is not None and not session.conns:
            self.left_at[session.id] = time.monotonic()

    def _session(self, c, sid: int) -> None:
        super()._session(c, sid)
        left = self.left_at.pop(sid, None)
        if left is not None:
            self.gaps.append(time.monotonic() - left)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secs", type=float, default=15.0)
    ap.add_argument("--busy", type=int, default=0, help="busy loops to run meanwhile")
    a = ap.parse_args()
    server = Timed()
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(a.busy)]
    agents = [
        subprocess.Popen([sys.executable, "-c", AGENT, str(server.port), str(i), str(a.secs + 2)]) for i in range(3)
    ]
    try:
        time.sleep(1.0)
        cuts, end = 0, time.monotonic() + a.secs
        while time.monotonic() < end:
            time.sleep(0.2)
            subprocess.run(
                ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{server.port}"], capture_output=True, check=True
            )
            cuts += 1
        for p in agents:
            p.wait(30)
    finally:
        for p in busy + agents:
            p.kill()
            p.wait()
        server.close()
    gaps = sorted(g * 1000 for g in server.gaps)
    if not gaps:
        sys.exit("no gap measured (is this root, with ss -K?)")
    pick = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]  # noqa: E731
    print(
        f"{cuts} cuts, {len(gaps)} gaps without a connection: median {statistics.median(gaps):.2f} ms, "
        f"p90 {pick(0.9):.2f} ms, p99 {pick(0.99):.2f} ms, max {gaps[-1]:.2f} ms (busy loops: {a.busy})"
    )


if __name__ == "__main__":
    main()
