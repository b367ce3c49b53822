"""A randomized fault campaign: seeded, bounded, replayable.

Run:  .venv/bin/python scripts/chaos.py [--backend c10d,etcd] [--episodes 20] [--seed N] [--bound 60]

Each episode runs a real elastic job: a rendezvous store (c10d: `python -m launcher store`; etcd: an
etcd member on loopback ports), 3 launcher agents (`--nnodes 2:3 --nproc_per_node 2 --max_restarts 3`,
default liveness settings, a 1 s last call, a 20 s join timeout) running tests/workers/steps.py, which checkpoints every
step. Once every worker runs, 1 or 2 faults from FAULTS strike at random times: a worker or an agent
SIGKILLed, a whole node frozen (SIGSTOP on agent and workers, SIGCONT after 2.5-4 s), the store
killed (c10d: the job must end with a reason naming it) or etcd killed and restarted on its data
(the job must ride it out or end with a reason), and, as root, the --log_dir disk filled (a 2 MiB
tmpfs). After the episode the invariants are checked (see `check`): no orphan process; every live
node agrees on the round, world and restarts; the true cause is named; the checkpoint is whole; no
worker line is lost on a node that finished; every node finishes or ends with a clear reason within
--bound s. A violation prints the episode's seed: `--seed S --episodes 1` replays it (the times and
the victims are the seed's; what the processes do with them is up to the kernel).

Exit status 0 when no invariant was violated, 1 otherwise. A network cut (link down between
namespace hosts) is not in the campaign yet: tests/test_faults.py covers it once.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "tests" / "workers" / "steps.py"
sys.path.insert(0, str(ROOT / "tests"))
from conftest import _is_helper, _parent, free_port, procs_with_token  # noqa: E402  (the tests' process helpers)
ROOTED = os.geteuid() == 0 and shutil.which("mount") is not None


class Fault(enum.Enum):
    WORKER_KILL = "worker-kill"
    AGENT_KILL = "agent-kill"
    NODE_FREEZE = "node-freeze"
    STORE_KILL = "store-kill"  # c10d: the job ends; etcd: killed and restarted on its data
    DISK_FULL = "disk-full"  # root only


FAULTS = {"c10d": list(Fault), "etcd": list(Fault)}


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class Proc:
    """A process of the episode with its own TEST_TOKEN; stdout and stderr read into lists by threads."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        self.name, self.token = name, uuid.uuid4().hex
        full = dict(os.environ, PYTHONPATH=str(ROOT), TEST_TOKEN=self.token, **env)
        full.pop("PET_PRELOAD", None)
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
                                      start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(s, into), daemon=True)
                        for s, into in ((self.popen.stdout, self.out), (self.popen.stderr, self.err))]
        for t in self.readers:
            t.start()
        self.killed = False  # by the campaign: its lines may be lost with it

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def workers(self) -> list[int]:
        return [p for p in procs_with_token(self.token) if p != self.popen.pid and not _is_helper(p) and _parent(p) == self.popen.pid]

    def starts(self) -> list[dict]:
        return [dict(re.findall(r"(\w+)=(\S+)", line)) | {"agent": self.name}
                for line in list(self.out) if " start rank=" in line]

    def finish(self, timeout: float) -> int | None:
        try:
            rc = self.popen.wait(max(0.1, timeout))
        except subprocess.TimeoutExpired:
            return None
        for t in self.readers:
            t.join(5)
        return rc

    def kill_all(self) -> None:
        pids = [self.popen.pid, *procs_with_token(self.token)]
        signal_all(pids, signal.SIGCONT)
        signal_all(pids, signal.SIGKILL)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


class Store:
    """The episode's rendezvous store: `launcher store` (c10d) or one etcd member (etcd)."""

    def __init__(self, backend: str, folder: Path):
        self.backend, self.folder = backend, folder
        self.port, self.peer = free_port(), free_port()
        self.proc: Proc | None = None
        self.start()

    def start(self) -> None:
        if self.backend == "c10d":
            self.proc = Proc("store", [sys.executable, "-m", "launcher", "store", "--host", "127.0.0.1", "--port", str(self.port)], {})
            ready = lambda: any("serving on" in line for line in self.proc.out + self.proc.err)  # noqa: E731
        else:
            url, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer}"
            self.proc = Proc("etcd", [shutil.which("etcd") or "etcd", "--name", "m0", "--data-dir", str(self.folder / "etcd"),
                                      "--listen-client-urls", url, "--advertise-client-urls", url, "--listen-peer-urls", peer,
                                      "--initial-advertise-peer-urls", peer, "--initial-cluster", f"m0={peer}",
                                      "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn"], {})
            ready = self._etcd_ready
        deadline = time.monotonic() + 20
        while not ready():
            if time.monotonic() > deadline or self.proc.popen.poll() is not None:
                raise RuntimeError(f"the {self.backend} store did not start: {self.proc.err[-5:]}")
            time.sleep(0.05)

    def _etcd_ready(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill_all()


@dataclass
class Episode:
    backend: str
    seed: int
    faults: list[tuple[float, Fault]] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # what was done, in order, for the report
    expect: list[tuple[str, str]] = field(default_factory=list)  # (what, regex a survivor's stderr must hold)
    violations: list[str] = field(default_factory=list)
    frozen: set[str] = field(default_factory=set)  # the nodes it froze


def plan(backend: str, seed: int, rooted: bool) -> Episode:
    """The seed's faults: 1 or 2, at 0-1.5 s after every worker runs, the store's at most once."""
    rng = random.Random(seed)
    ep = Episode(backend, seed)
    kinds = [f for f in FAULTS[backend] if rooted or f is not Fault.DISK_FULL]
    for _ in range(rng.choice((1, 1, 2))):
        fault = rng.choice(kinds)
        if fault is Fault.STORE_KILL:
            kinds = [f for f in kinds if f is not Fault.STORE_KILL]
        ep.faults.append((round(rng.uniform(0.0, 1.5), 3), fault))
    ep.faults.sort(key=lambda f: f[0])
    return ep


def run_episode(ep: Episode, bound: float, keep: bool = False, verbose: bool = False) -> Episode:
    rng = random.Random(ep.seed * 7919 + 1)  # victims and freeze lengths
    folder = Path(tempfile.mkdtemp(prefix=f"chaos-{ep.backend}-{ep.seed}-"))
    ckpt, logs = folder / "ckpt", folder / "logs"
    ckpt.mkdir()
    logs.mkdir()
    mounted = False
    if any(f is Fault.DISK_FULL for _, f in ep.faults):
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(logs)], capture_output=True).returncode == 0
    store = agents = None
    try:
        store = Store(ep.backend, folder)
        # join_timeout inside the bound: nodes left below MIN wait for replacements that long (elastic), then say so
        conf = "last_call_timeout=1,read_timeout=3,join_timeout=20" + (",is_host=false" if ep.backend == "c10d" else "")
        args = [sys.executable, "-m", "launcher", "--nnodes", "2:3", "--nproc_per_node", "2", "--max_restarts", "3",
                "--rdzv_backend", ep.backend, "--rdzv_endpoint", f"127.0.0.1:{store.port}", "--rdzv_id", f"chaos{ep.seed}",
                "--rdzv_conf", conf, "--log_dir", str(logs), str(STEPS)]
        env = {"CKPT_DIR": str(ckpt), "STEPS": "80", "STEP_TIME": "0.05"}
        agents = [Proc(f"node{i}", args, env) for i in range(3)]
        t_start = time.monotonic()
        while sum(len(a.starts()) for a in agents) < 6:
            if time.monotonic() - t_start > bound / 2:
                ep.violations.append("the job never started: not every worker of the first round ran")
                return ep
            time.sleep(0.02)
        t0 = time.monotonic()
        for at, fault in ep.faults:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            inject(ep, fault, agents, store, logs if mounted else None, rng)
        deadline = t0 + bound
        rcs = {a.name: (a.finish(deadline - time.monotonic()) if not a.killed else -9) for a in agents}
        check(ep, agents, rcs, ckpt, logs)
        if ep.violations and verbose:
            for a in agents:
                print(f"----- {a.name} rc={rcs[a.name]}\n" + "\n".join(a.err[-30:]), flush=True)
    except Exception as e:  # the harness itself: reported as a violation, never swallowed
        ep.violations.append(f"harness error: {type(e).__name__}: {e}")
    finally:
        for a in agents or []:
            a.kill_all()
        if store is not None:
            store.kill()
        if mounted:
            subprocess.run(["umount", "-l", str(logs)], capture_output=True)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    return ep


def inject(ep: Episode, fault: Fault, agents: list[Proc], store: Store, disk: Path | None, rng: random.Random) -> None:
    alive = [a for a in agents if not a.killed and a.popen.poll() is None]
    if not alive:
        return
    victim = rng.choice(alive)
    if fault is Fault.WORKER_KILL:
        workers = victim.workers()
        if workers:
            pid = rng.choice(workers)
            signal_all([pid], signal.SIGKILL)
            ep.done.append(f"SIGKILL worker {pid} of {victim.name}")
            ep.expect.append(("the killed worker", rf"pid {pid}|killed by SIGKILL|: failure\)"))
    elif fault is Fault.AGENT_KILL:
        signal_all([victim.popen.pid], signal.SIGKILL)
        victim.killed = True
        ep.done.append(f"SIGKILL agent {victim.name}")
        ep.expect.append(("the killed agent", r"died|lost its lease|stopped heartbeating"))
    elif fault is Fault.NODE_FREEZE:
        pids = [victim.popen.pid, *victim.workers()]
        signal_all(pids, signal.SIGSTOP)
        length = rng.uniform(2.5, 4.0)
        threading.Timer(length, signal_all, args=(pids, signal.SIGCONT)).start()
        ep.done.append(f"SIGSTOP {victim.name} for {length:.1f} s")
        ep.frozen.add(victim.name)
        ep.expect.append(("the frozen node", r"stopped heartbeating|lost its lease"))
    elif fault is Fault.STORE_KILL:
        store.kill()
        if ep.backend == "etcd":
            pause = rng.uniform(0.2, 1.5)
            time.sleep(pause)
            store.start()
            ep.done.append(f"etcd killed, restarted after {pause:.1f} s")
        else:
            ep.done.append("store SIGKILLed")
            ep.expect.append(("the lost store", r"rendezvous store"))
    elif fault is Fault.DISK_FULL and disk is not None:
        subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=64k"], capture_output=True)
        ep.done.append("log disk filled")


DISTURBED = re.compile(r"membership changed|restarting|reason: |exited with|killed by|rendezvous store")


def check(ep: Episode, agents: list[Proc], rcs: dict[str, int | None], ckpt: Path, logs: Path) -> None:
    v = ep.violations
    live = [a for a in agents if not a.killed]
    for a in live:  # finish, or a clear reason, within the bound
        rc = rcs[a.name]
        text = "\n".join(a.err)
        if rc is None:
            v.append(f"{a.name} still running after the bound")
        elif "Traceback" in text:
            v.append(f"{a.name}: a Python traceback on the agent's stderr")
        elif rc != 0 and not re.search(r"reason: |error: ", text):
            v.append(f"{a.name}: exit {rc} with no reason given")
    for a in agents:  # no orphan: the agent and everything it started are gone
        if rcs.get(a.name) is not None:
            deadline = time.monotonic() + 10
            while procs_with_token(a.token) and time.monotonic() < deadline:
                time.sleep(0.05)
            if procs_with_token(a.token):
                v.append(f"{a.name}: processes left after its agent ended: {procs_with_token(a.token)}")
    by_round: dict[str, list[dict]] = {}
    for a in agents:
        for s in a.starts():
            by_round.setdefault(s["round"], []).append(s)
    for rnd, seen in sorted(by_round.items()):  # agreement on the round's world and restarts, ranks unique
        if len({s["world"] for s in seen}) != 1 or len({s["restart"] for s in seen}) != 1:
            v.append(f"round {rnd}: nodes disagree: {sorted({(s['agent'], s['world'], s['restart']) for s in seen})}")
        ranks = [s["rank"] for s in seen]
        if len(ranks) != len(set(ranks)):
            v.append(f"round {rnd}: a rank ran twice: {sorted(ranks)}")
    causes = "|".join(f"(?:{rx})" for _, rx in ep.expect) or r"(?!)"
    for a in live:  # the true cause named: what first disturbed each survivor is one of the faults
        if a.name in ep.frozen:
            continue  # it missed the change it wakes to; the others name why
        first = next((line for line in a.err if DISTURBED.search(line)), None)
        if first is not None and not re.search(causes, first):
            v.append(f"{a.name} named a cause that was not injected: {first!r} (injected: {'; '.join(ep.done)})")
    said = [line for a in live for line in a.err if DISTURBED.search(line)]
    if said and len(ep.expect) == 1 and not any(re.search(causes, line) for line in said):  # two faults: one may hide the other
        v.append(f"no survivor named {ep.expect[0][0]}; they said: {said[:3]}")
    try:
        json.loads((ckpt / "ckpt.json").read_text())
    except FileNotFoundError:
        pass
    except ValueError as e:
        v.append(f"checkpoint not whole: {e}")
    for a in live:  # no step line lost on a node that finished
        if rcs[a.name] != 0:
            continue
        last: dict[tuple[str, str], int] = {}
        for line in a.out:
            m = re.search(r"\[rank(\d+)\]: (start|step) rank=\d+ (?:world=\S+ restart=\S+ round=\S+ from=(\d+)|n=(\d+))", line)
            if not m:
                continue
            rank, kind = m.group(1), m.group(2)
            if kind == "start":
                last[rank] = int(m.group(3))
            elif rank in last:
                n = int(m.group(4))
                if n != last[rank] + 1:
                    v.append(f"{a.name}: rank {rank} printed step {n} after step {last[rank]}: a line was lost")
                last[rank] = n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="c10d,etcd")
    ap.add_argument("--episodes", type=int, default=20, help="per backend")
    ap.add_argument("--seed", type=int, default=None, help="first episode's seed (default: from the clock); episode i uses seed+i")
    ap.add_argument("--bound", type=float, default=60.0, help="seconds from the first fault until every node must have ended")
    ap.add_argument("--keep", action="store_true", help="keep each episode's folder (logs, checkpoint)")
    ap.add_argument("--verbose", action="store_true", help="print the agents' stderr on a violation")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped campaign still kills its episode's processes
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    print(f"chaos: seed {seed}, {args.episodes} episode(s) per backend ({args.backend}); replay one: --seed S --episodes 1",
          flush=True)
    total = 0
    for backend in args.backend.split(","):
        if backend == "etcd" and not shutil.which("etcd"):
            print("chaos: etcd: no etcd binary on PATH, skipped", flush=True)
            continue
        bad = 0
        for i in range(args.episodes):
            ep = run_episode(plan(backend, seed + i, ROOTED), args.bound, args.keep, args.verbose)
            status = "ok" if not ep.violations else "VIOLATION"
            print(f"chaos: {backend} seed {ep.seed}: {status}: {'; '.join(ep.done) or 'no fault landed'}", flush=True)
            for line in ep.violations:
                print(f"chaos:   {line}   (replay: --backend {backend} --seed {ep.seed} --episodes 1)", flush=True)
            bad += bool(ep.violations)
        print(f"chaos: {backend}: {args.episodes} episodes, {bad} with violations", flush=True)
        total += bad
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
