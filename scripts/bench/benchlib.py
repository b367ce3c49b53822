"""Helpers every benchmark here shares: the launcher's revision, a private loopback network, a free
port, and how busy the rest of the machine was meanwhile. Scripts import it as `benchlib` (their
own folder is first on sys.path)."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def revision() -> str:
    """The launcher's commit, and whether launcher/ has uncommitted changes (it moves under benchmarks)."""
    git = ["git", "-C", HERE]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    diff = subprocess.run([*git, "diff", "HEAD", "--", "../../launcher"], capture_output=True).stdout
    return f"launcher at {head or '?'}" + (f" + uncommitted diff {hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")


def private_network() -> None:
    """Re-run this script in a new network namespace holding only loopback (root only; --host-net opts out)."""
    if os.environ.get("BENCH_NETNS") or "--host-net" in sys.argv or os.geteuid() != 0 or not shutil.which("unshare"):
        return
    os.environ["BENCH_NETNS"] = "1"
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable, *sys.argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_snapshot() -> tuple[float, float, float]:
    """(now, host busy CPU seconds, CPU seconds of this script and its waited-for descendants)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), busy, me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def other_load(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """Cores used on average between two snapshots by processes this script did not start."""
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0])
