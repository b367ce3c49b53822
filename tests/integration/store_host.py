"""A TCPStore server for the tests in a process of its own: ours, or torch's libuv server (the reference).

    python store_host.py ours|libuv [BUDGET]

Prints its port on one line, then answers each line read on stdin with one JSON line of what it holds:
rss and hwm (VmRSS and VmHWM, bytes), and for ours held, peak_held and stalled (StoreServer's counters).
It exits when stdin closes.
"""

from __future__ import annotations

import json
import os
import sys


def memory() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {"rss": int(fields["VmRSS"].split()[0]) << 10, "hwm": int(fields["VmHWM"].split()[0]) << 10}


def main() -> None:
    kind = sys.argv[1]
    if kind == "libuv":
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
        import torch.distributed as dist

        server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False)
        stats = memory
    else:
        from launcher.tcpstore import StoreServer

        budget = int(sys.argv[2]) if len(sys.argv) > 2 else None
        server = StoreServer("127.0.0.1", 0, **({"budget": budget} if budget else {}))

        def stats() -> dict[str, int]:
            return {**memory(), "held": server.held, "peak_held": server.peak_held, "stalled": server.stalled}

    print(server.port, flush=True)
    for _ in sys.stdin:
        print(json.dumps(stats()), flush=True)


if __name__ == "__main__":
    main()
