"""torch's `wait(keys, timeout=0)` against our store and torch's libuv server, side by side (issue 32 item 7).

torch's client sends WAIT and polls its socket for the answer with the timeout: 0 ms is one poll
at once. When the answer is not there yet, the client sends CANCEL_WAIT and raises "wait timeout
after 0ms", even for a key that is set; it then reads STOP_WAITING (the answer came first) and
WAIT_CANCELED. So whether a zero-timeout wait on a present key succeeds is a race the client runs
against any server's reply latency (libuv's, a C event loop's, is shorter than ours). What a server
owes the client: every outcome is success or that timeout, a cancelled wait leaves nothing behind
(a key set later sends no stray STOP_WAITING into the next answer), and the connection serves on.
"""

from __future__ import annotations

import json

import pytest
from support import forks, needs
from support.tcpstore import QUIET, torch_store_server

from launcher.tcpstore import StoreServer

pytestmark = needs.torch

ROUNDS = 6  # per server: each round checks a present key, a missing one, and what a cancel leaves behind

CLIENT = r"""
import datetime, json, sys
import torch.distributed as dist

port, rounds = int(sys.argv[1]), int(sys.argv[2])
c = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
zero = datetime.timedelta(seconds=0)
seen = {"present_ok": 0, "present_timeout": 0, "missing_timeout": 0, "other": []}
for i in range(rounds):
    c.set(f"present{i}", b"v")
    for kind in ("present", "missing"):
        try:
            c.wait([f"{kind}{i}"], zero)
            seen[f"{kind}_ok"] = seen.get(f"{kind}_ok", 0) + 1
        except Exception as e:
            if "wait timeout after 0ms" in str(e):
                seen[f"{kind}_timeout"] += 1
            else:
                seen["other"].append(f"{type(e).__name__}: {e}")
    # the cancelled wait on missing{i} must be gone: setting it now sends nothing into GET's answer
    c.set(f"missing{i}", b"late")
    got = (c.get(f"missing{i}"), c.get(f"present{i}"), c.add(f"n{i}", 1))
    if got != (b"late", b"v", 1):
        seen["other"].append(f"round {i}: {got!r}")
print(json.dumps(seen))
"""


def zero_waits(port: int) -> dict:
    r = forks.run(CLIENT, str(port), str(ROUNDS), timeout=240, env=QUIET)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.timeout(300)
def test_a_zero_timeout_wait_answers_as_libuv_and_leaves_nothing_behind():
    ours = StoreServer("127.0.0.1", 0)
    libuv = torch_store_server("libuv")
    try:
        _, libuv_port = next(libuv)
        seen = {"ours": zero_waits(ours.port), "libuv": zero_waits(libuv_port)}
    finally:
        libuv.close()
        ours.close()
    print(seen)  # the race's outcome on this host: how many present keys beat the client's poll
    for name, s in seen.items():
        assert s["other"] == [], (name, s["other"])
        assert s.get("missing_ok", 0) == 0 and s["missing_timeout"] == ROUNDS, (name, s)
        assert s.get("present_ok", 0) + s["present_timeout"] == ROUNDS, (name, s)
