"""Helpers the benchmarks here share: the launcher's revision, a private loopback network, a free
port, a one-member etcd, how busy the rest of the machine was meanwhile, and the runner that releases
many simulated nodes at once; the launchers compared side by side and the DDP worker's model. Scripts
import it as `benchlib` (their own folder is first on sys.path)."""

from __future__ import annotations

import collections
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from launcher.net import free_port  # noqa: F401  (the scripts take it from here: a port below the ephemeral range)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.etcd import Member  # support/ (tests/) is on sys.path only once etcd_member ran

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
TORCHRUN = os.path.join(os.path.dirname(PY), "torchrun")
TOOLS = {  # the launchers a restart benchmark compares, by the name its table gives them
    "torchrun": [TORCHRUN],
    "launcher": [PY, "-m", "launcher"],
    "launcher --preload": [PY, "-m", "launcher", "--preload"],
}
# A DDP worker's first lines (its output folder is argv[1]) and its model, for the benchmarks' workers.
DDP_IMPORTS = """import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
out = sys.argv[1]
"""
DDP_MODEL = """dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
"""


def revision() -> str:
    """The launcher's commit, and whether launcher/ has uncommitted changes (it moves under benchmarks)."""
    git = ["git", "-C", HERE]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    diff = subprocess.run([*git, "diff", "HEAD", "--", "../../launcher"], capture_output=True).stdout
    return f"launcher at {head or '?'}" + (f" + uncommitted diff {hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")


def need(module: str, what: str, other: str = "") -> None:
    """Stop at once, with the command that installs it, when `what` needs `module` (an extra) and this
    interpreter lacks it: found later, in the runner processes, it read as a runner that never
    connected, two minutes on. `other`: the way to run without it. Locates the module, imports nothing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        script = os.path.basename(sys.argv[0])
        root = os.path.dirname(os.path.dirname(HERE))
        root = os.path.relpath(root) if not os.path.relpath(root).startswith("..") else root
        fix = f"{sys.executable} -m pip install -e '{root}[bench]'"
        sys.stderr.write(f"{script}: needs {module} for {what}, which {sys.executable} lacks: {fix}{other}\n")
        sys.exit(2)


def private_network() -> None:
    """Re-run this script in a new network namespace holding only loopback (root only; --host-net opts out)."""
    if os.environ.get("BENCH_NETNS") or "--host-net" in sys.argv or os.geteuid() != 0 or not shutil.which("unshare"):
        return
    os.environ["BENCH_NETNS"] = "1"
    os.execvp(
        "unshare", ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable, *sys.argv]
    )


def etcd_member(folder: str) -> Member:
    """One etcd member with etcd's default timings on free loopback ports, its data and log in `folder`,
    once healthy: the tests' `support.etcd.Member` (as scripts/stress/ uses it); BENCH_ETCD_FLAGS adds flags."""
    tests = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir, "tests"))
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support.etcd import Member  # here, not at import: it loads pytest, which only the etcd benchmarks need

    member = Member(Path(folder), "bench", fast=False, extra=tuple(os.environ.get("BENCH_ETCD_FLAGS", "").split()))
    member.start().wait_ready(30)
    return member


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


class Counting:
    """Forwards every call to `inner`, counting calls per method (and, with count_bytes, the bytes
    that get and compare_set carry: torch's rendezvous moves its whole state through them)."""

    def __init__(self, inner, counts: collections.Counter, count_bytes: bool = False):
        self.inner, self.counts, self.count_bytes = inner, counts, count_bytes

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.counts[name] += 1
            result = attr(*args, **kwargs)
            if self.count_bytes and name in ("get", "compare_set"):
                self.counts["bytes"] += len(result or b"") + sum(len(a) for a in args[1:])
            return result

        return call


def release_together(
    m: int, prepare: Callable[[int], Callable[[], object]], nofile: int, give_up_after: float | None = None
) -> dict:
    """Simulated nodes as m threads of this runner process. prepare(j) builds node j (untimed) and
    returns the call that joins a round; once all are built, print "ready", and on a line from
    stdin start every join at once. -> t0, end, setup_s, cpu_s, done [(result, time)], errors.
    With give_up_after, a runner still going that many seconds after t0 prints where its
    threads are and exits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, nofile)), hard))
    threading.stack_size(1 << 20)
    ready, go = threading.Barrier(m + 1), threading.Event()
    results: list = [None] * m

    def node(j: int) -> None:
        try:
            join = prepare(j)
        except Exception as e:
            results[j], join = f"setup: {type(e).__name__}: {e}", None
        ready.wait()
        go.wait()
        if join is not None:
            try:
                results[j] = (join(), time.time())
            except Exception as e:
                results[j] = f"{type(e).__name__}: {e}".strip()

    t = time.monotonic()
    threads = [threading.Thread(target=node, args=(j,), daemon=True) for j in range(m)]
    for th in threads:
        th.start()
    ready.wait()
    setup_s = time.monotonic() - t
    print("ready", flush=True)
    sys.stdin.readline()
    t0, cpu0 = time.time(), time.process_time()
    go.set()
    if give_up_after is not None:
        threading.Timer(give_up_after, _stuck, args=(threads,)).start()
    for th in threads:
        th.join()
    return {
        "t0": t0,
        "end": time.time(),
        "setup_s": setup_s,
        "cpu_s": time.process_time() - cpu0,
        "done": [r for r in results if isinstance(r, tuple)],
        "errors": [r for r in results if not isinstance(r, tuple)],
    }


def _stuck(threads: list[threading.Thread]) -> None:
    """Past the join timeout: tell where the threads still running are (stderr), then hard exit."""
    frames = sys._current_frames()
    where = collections.Counter(
        " < ".join(
            f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
            for f in traceback.extract_stack(frames[t.ident])[:-5:-1]
        )
        for t in threads
        if t.is_alive() and t.ident in frames
    )
    for stack, count in where.most_common(5):
        print(f"    {count} threads still in {stack}", file=sys.stderr, flush=True)
    os._exit(3)


def combine(outs: list[dict], n: int) -> dict:
    """One run's figures from its runners' release_together() results (with their "counts"):
    ok, counts, cpu_s, setup_s, and rdzv_s (t0 to the last node holding its round) or error;
    n nodes must hold ranks 0..n-1 of a world of n."""
    done = [d for o in outs for d in o["done"]]
    errors = [e for o in outs for e in o["errors"]]
    counts = sum((collections.Counter(o["counts"]) for o in outs), collections.Counter())
    t0 = min(o["t0"] for o in outs)
    result = {
        "ok": not errors,
        "counts": dict(counts),
        "cpu_s": sum(o["cpu_s"] for o in outs),
        "setup_s": max(o["setup_s"] for o in outs),
    }
    if errors:
        result["error"] = (
            f"did not complete in {max(o['end'] for o in outs) - t0:.0f} s: "
            f"{len(errors)}/{n} nodes failed ({errors[0][:80]})"
        )
    else:
        result["rdzv_s"] = max(d[1] for d in done) - t0
        if sorted(d[0][0] for d in done) != list(range(n)) or any(d[0][1] != n for d in done):
            result.update(ok=False, error="ranks or world size wrong")
    return result
