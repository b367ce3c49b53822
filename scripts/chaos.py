"""A randomized fault campaign: seeded, bounded, replayable.

Run:  .venv/bin/python scripts/chaos.py [--backend c10d,etcd] [--shape elastic,spares] [--episodes 20] [--seed N]
      [--bound 60]

Each episode runs a real elastic job: 3 launcher agents (`--nnodes 2:3 --nproc_per_node 2 --max_restarts 3`,
a 2 s liveness timeout (the default before issue 32: the faults are sized around it), a 1 s last call,
a 3 s read timeout, a 20 s join timeout) running
tests/workers/steps.py, which checkpoints every step (4 s of training; 12 s with a link cut, 20 s with a
link down for good), on a rendezvous store: c10d, `python -m launcher store`; etcd, a 3-member etcd
cluster (static bootstrap, throwaway data dirs, elections within about a second) whose three endpoints
every agent is given. As root with iproute2, every episode runs on hosts of its own: a hub network
namespace (a bridge at 10.117.0.1, where the store or etcd runs) and one namespace per node
(10.117.0.11-13) on a veth into the bridge, all deleted when the episode ends, however it ends (those of
a campaign killed outright are deleted by the next one). Without root the episode runs on loopback.

Once every worker runs, 1 or 2 faults from FAULTS strike at random times (at most one per episode hits
the store):
- worker-kill: a worker SIGKILLed; agent-kill: an agent SIGKILLed (its guard stops its workers);
- node-freeze: SIGSTOP on an agent and its workers, SIGCONT after 2.5-4 s;
- store-kill: c10d, the store killed (the job must end with a reason naming it); etcd, every member
  killed and restarted on its data (the job must ride it out or end with a reason);
- disk-full (root): the --log_dir disk filled (a 2 MiB tmpfs);
- link-cut (root): one node's link set down, at the node or at the hub's bridge, for 1-12 s (both
  sides of the 2 s liveness timeout and of the 3 s read timeout), then up again;
- link-down (root): the same, down until the episode ends;
- etcd-member-kill, etcd-leader-kill (etcd): a follower, or the leader (found through etcd's
  /v3/maintenance/status), SIGKILLed and restarted on its data dir 0.5-3 s later; quorum is kept.

After the episode the invariants are checked (see `check`): no orphan process; every live node agrees
on the round, world and restarts; no more restarts charged than workers killed; the true cause named;
the checkpoint whole; no worker line lost on a node that finished; every node finishes or ends with a
clear reason within --bound s. Beside those, per fault:
- a link cut or down: the cut node finishes, or ends with a reason naming the rendezvous store (or,
  back in time, the job's close), no traceback, nothing of it left; a link down for good: that reason
  names the store, and its workers stop within read_timeout + 9 s of the cut (none runs on, cut off);
  a cut past the liveness timeout, the episode's only fault that stops a node: every other node runs
  a round without it, or has finished, within the liveness timeout + 10 s;
- an etcd member or the leader lost (quorum kept), or the disk full, alone: ridden out, every node
  finishes in the first round with no restart and no membership change.

Shape `spares` (issue 22): a fixed-size job, `--nnodes 2` with the same three agents; the third starts once
both members' workers run and waits as a spare. Its invariants, beside the ones above: the world size never
changes (every worker of every round sees 4); a member lost (killed, frozen, or cut past the liveness
timeout) while the spare is untouched is replaced by the spare, which runs workers in a later round; every
node that was neither killed, frozen nor cut ends with the same exit code, the spare included (the job's
verdict); a lost member is charged to the budget: no more restarts than workers killed plus nodes lost.
The spares shape also runs `--quarantine after=1,window=2`, each agent named by SLURMD_NODENAME (the three
share a host name): a node whose worker was killed is quarantined at once, exits 69 and never runs a worker
again (no quarantined node is admitted), and the spare takes its place like a lost member's; so there a
worker kill is also a fault that stops a node.

A violation prints the episode's seed: `--seed S --episodes 1` replays it (the times and the victims
are the seed's; what the processes do with them is up to the kernel); `--keep` keeps its folder with
the agents' output. The last lines count the faults that landed, per kind, and the seconds an episode
took. Exit status 0 when no invariant was violated, 1 otherwise.
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "tests" / "workers" / "steps.py"
sys.path.insert(0, str(ROOT / "tests"))
from support.ports import free_port  # noqa: E402  (the tests' helpers)
from support.processes import is_helper, parent_pid, procs_with_token  # noqa: E402

IS_ROOT = os.geteuid() == 0
SUBNET = "10.117.0"  # the episode's hosts; these addresses exist only inside its namespaces
NODES = 3
LIVENESS = (
    2.0  # the episodes' keep_alive_interval x keep_alive_max_attempt (0.5 s x 4; the default is 6 s since issue 32)
)
READ_TIMEOUT = 3.0  # the episodes' --rdzv_conf read_timeout
REFORM_S = 10.0  # after the liveness timeout: for the others to see a cut node gone and re-form, on busy cores
# A node cut off for good stops its workers within this of the cut: c10d's client waits read_timeout + 5 s
# for an answer (etcd: read_timeout after its lease's refreshes began to fail), and a few s on busy cores.
STOP_S = READ_TIMEOUT + 5.0 + 4.0


class Fault(enum.Enum):
    WORKER_KILL = "worker-kill"
    AGENT_KILL = "agent-kill"
    NODE_FREEZE = "node-freeze"
    STORE_KILL = "store-kill"  # c10d: the job ends; etcd: every member killed and restarted on its data
    DISK_FULL = "disk-full"  # root only
    LINK_CUT = "link-cut"  # root and namespaces only: down for 1-12 s, then up
    LINK_DOWN = "link-down"  # root and namespaces only: down until the episode ends
    MEMBER_KILL = "etcd-member-kill"  # a follower; etcd only
    LEADER_KILL = "etcd-leader-kill"  # etcd only


COMMON = [
    Fault.WORKER_KILL,
    Fault.AGENT_KILL,
    Fault.NODE_FREEZE,
    Fault.STORE_KILL,
    Fault.DISK_FULL,
    Fault.LINK_CUT,
    Fault.LINK_DOWN,
]
FAULTS = {"c10d": COMMON, "etcd": [*COMMON, Fault.MEMBER_KILL, Fault.LEADER_KILL]}
STORE_FAULTS = {Fault.STORE_KILL, Fault.MEMBER_KILL, Fault.LEADER_KILL}  # at most one per episode
STOPS_A_NODE = {Fault.AGENT_KILL, Fault.NODE_FREEZE, Fault.STORE_KILL, Fault.LINK_CUT, Fault.LINK_DOWN}
QUARANTINES = {Fault.WORKER_KILL}  # the spares shape's --quarantine after=1: its node leaves the job
QUARANTINED = re.compile(r"reason: \S+ is quarantined: ")  # its own failure, told before the cut's (exit 69)
LINK_FAULTS = {Fault.LINK_CUT, Fault.LINK_DOWN}
RIDDEN_OUT = {Fault.MEMBER_KILL, Fault.LEADER_KILL, Fault.DISK_FULL}  # the job goes on as if nothing happened


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def ports(n: int) -> list[int]:
    """`n` distinct free ports (free_port may hand out one port twice in a row)."""
    got: list[int] = []
    while len(got) < n:
        port = free_port()
        if port not in got:
            got.append(port)
    return got


def sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=10)


class Proc:
    """A process of the episode with its own TEST_TOKEN, in network namespace `host` if given; stdout
    and stderr read into lists by threads (stdout with each line's arrival time)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], host: str | None = None):
        self.name, self.token, self.host = name, uuid.uuid4().hex, host
        full = dict(os.environ, PYTHONPATH=str(ROOT), TEST_TOKEN=self.token, **env)
        full.pop("PET_PRELOAD", None)
        cmd = ["ip", "netns", "exec", host, *argv] if host else argv  # ip execs the command: same pid
        self.popen = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, start_new_session=True
        )
        self.out: list[str] = []
        self.out_at: list[float] = []
        self.err: list[str] = []
        self.err_at: list[float] = []
        self.ended_at: float | None = None  # when its stdout closed: it ended
        self.readers = [
            threading.Thread(target=self._read, args=(s, into, at), daemon=True)
            for s, into, at in ((self.popen.stdout, self.out, self.out_at), (self.popen.stderr, self.err, self.err_at))
        ]
        for t in self.readers:
            t.start()
        self.killed = False  # by the campaign: its lines may be lost with it

    def _read(self, stream, into: list[str], at: list[float]) -> None:
        for line in stream:
            at.append(time.monotonic())
            into.append(line.rstrip("\n"))
        if stream is self.popen.stdout:
            self.ended_at = time.monotonic()

    def workers(self) -> list[int]:
        return [
            p
            for p in procs_with_token(self.token)
            if p != self.popen.pid and not is_helper(p) and parent_pid(p) == self.popen.pid
        ]

    def starts(self) -> list[dict]:
        """Every "start" line of the steps worker, parsed, with `at`, when it was read."""
        return [
            dict(re.findall(r"(\w+)=(\S+)", line)) | {"agent": self.name, "at": at}
            for line, at in zip(list(self.out), list(self.out_at))
            if " start rank=" in line
        ]

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


# ---------------------------------------------------------------------------- the network


class Net:
    """The episode's hosts: namespace `hub` holds a bridge at SUBNET.1 (the store or etcd runs there);
    node i's namespace holds eth0 at SUBNET.(11+i), a veth whose other end, p<i>, is a port of the bridge.
    No interface or address is made outside these namespaces; close() deletes them, and with them
    every veth and the bridge."""

    def __init__(self, tag: str, nodes: int = NODES):
        self.hub, self.nodes = f"{tag}-hub", [f"{tag}-n{i}" for i in range(nodes)]
        self.made: list[str] = []
        try:
            for ns in (self.hub, *self.nodes):
                self._ip("netns", "add", ns)
                self.made.append(ns)
                self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.hub, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
            self._ip("-n", self.hub, "link", "set", "br0", "up")
            for i, ns in enumerate(self.nodes):
                self._ip("-n", self.hub, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._ip("-n", self.hub, "link", "set", f"p{i}", "master", "br0", "up")
                self._ip("-n", ns, "addr", "add", f"{SUBNET}.{11 + i}/24", "dev", "eth0")
                self._ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        r = sh("ip", *args)
        if r.returncode:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def link(self, node: int, at: str, state: str) -> None:
        """Set node's link `state` ("down" or "up") at the node's end ("node") or the bridge's ("hub")."""
        ns, dev = (self.nodes[node], "eth0") if at == "node" else (self.hub, f"p{node}")
        sh("ip", "-n", ns, "link", "set", dev, state)  # after close(): the namespace is gone, nothing to do

    def close(self) -> None:
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns)
        self.made.clear()


def netns_usable() -> bool:
    """Root, iproute2, and a namespace can be made here."""
    if not IS_ROOT or shutil.which("ip") is None:
        return False
    probe = f"chaos{os.getpid()}-probe"
    ok = sh("ip", "netns", "add", probe).returncode == 0
    sh("ip", "netns", "del", probe)
    return ok


def sweep_namespaces() -> None:
    """Delete the namespaces of campaigns that died without deleting theirs (their pid in the name is gone)."""
    for line in sh("ip", "netns", "list").stdout.splitlines():
        m = re.match(r"(chaos(\d+)-\S+)", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            sh("ip", "netns", "del", m.group(1))


# ---------------------------------------------------------------------------- the store


class C10dStore:
    """`launcher store` on ADDR (in namespace `host`)."""

    def __init__(self, addr: str, host: str | None):
        self.addr, self.host, self.port = addr, host, free_port()
        self.endpoint = f"{addr}:{self.port}"
        self.proc = Proc(
            "store", [sys.executable, "-m", "launcher", "store", "--host", addr, "--port", str(self.port)], {}, host
        )
        deadline = time.monotonic() + 20
        while not any("serving on" in line for line in self.proc.out + self.proc.err):
            if time.monotonic() > deadline or self.proc.popen.poll() is not None:
                raise RuntimeError(f"the c10d store did not start: {self.proc.err[-5:]}")
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.kill_all()


# Run in the store's namespace: what an etcd member answers on `url` (a POST of `body` if given), or nothing.
ASK = (
    "import sys, urllib.request as u\n"
    "try: print(u.urlopen(u.Request(sys.argv[1], sys.argv[2].encode() or None), timeout=1).read().decode())\n"
    "except OSError: pass\n"
)


class EtcdCluster:
    """SIZE etcd members on ADDR's ports (in namespace `host`), bootstrapped statically, their data in
    `folder`; a member is killed and restarted on its data; close() stops them for good."""

    def __init__(self, folder: Path, addr: str, host: str | None, size: int = 3):
        self.folder, self.addr, self.host = folder, addr, host
        flat = ports(2 * size)
        self.ports = list(zip(flat[::2], flat[1::2]))  # (client, peer) of each member
        self.endpoint = ",".join(f"{addr}:{client}" for client, _ in self.ports)
        self.initial = ",".join(f"m{i}=http://{addr}:{peer}" for i, (_, peer) in enumerate(self.ports))
        self.procs: list[Proc | None] = [None] * size
        self._lock = threading.Lock()
        self._closed = False
        self.start_all()

    def start(self, i: int) -> None:
        client, peer = (f"http://{self.addr}:{p}" for p in self.ports[i])
        argv = [
            shutil.which("etcd") or "etcd",
            "--name",
            f"m{i}",
            "--data-dir",
            str(self.folder / f"etcd{i}"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial,
            "--initial-cluster-token",
            self.folder.name,
            "--log-level",
            "warn",
            "--logger",
            "zap",
            # an election within about a second (etcd's defaults: 1-3 s, close to the episodes' read_timeout)
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]
        with self._lock:  # a restart timer that fires after close() starts nothing
            if not self._closed:
                self.procs[i] = Proc(f"etcd{i}", argv, {}, self.host)

    def start_all(self) -> None:
        for i in range(len(self.ports)):
            self.start(i)
        deadline = time.monotonic() + 30
        while not all(self.ask(i, "/health").get("health") == "true" for i in range(len(self.ports))):
            if time.monotonic() > deadline or any(p is None or p.popen.poll() is not None for p in self.procs):
                raise RuntimeError(f"the etcd cluster did not start: {[p.err[-3:] for p in self.procs if p]}")
            time.sleep(0.1)

    def ask(self, i: int, path: str, body: str = "") -> dict:
        """Member i's JSON answer on `path` ({} when it does not answer), asked from inside its namespace."""
        argv = [sys.executable, "-c", ASK, f"http://{self.addr}:{self.ports[i][0]}{path}", body]
        r = subprocess.run(
            ["ip", "netns", "exec", self.host, *argv] if self.host else argv, capture_output=True, text=True, timeout=10
        )
        try:
            return json.loads(r.stdout or "{}")
        except ValueError:
            return {}

    def leader(self) -> int | None:
        """The member that is the leader now, by its own /v3/maintenance/status."""
        for i, p in enumerate(self.procs):
            if p is not None and p.popen.poll() is None:
                status = self.ask(i, "/v3/maintenance/status", "{}")
                if status.get("leader") and status.get("leader") == status.get("header", {}).get("member_id"):
                    return i
        return None

    def kill(self, i: int) -> None:
        if self.procs[i] is not None:
            self.procs[i].kill_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for i in range(len(self.procs)):
            self.kill(i)


# ---------------------------------------------------------------------------- an episode


class Shape(enum.Enum):
    ELASTIC = "elastic"  # --nnodes 2:3, three members
    SPARES = "spares"  # --nnodes 2, two members and a spare


@dataclass
class Episode:
    backend: str
    seed: int
    shape: Shape = Shape.ELASTIC
    faults: list[tuple[float, Fault]] = field(default_factory=list)
    landed: list[Fault] = field(default_factory=list)  # the faults that struck, in order
    done: list[str] = field(default_factory=list)  # what was done, in order, for the report
    expect: list[tuple[str, str]] = field(default_factory=list)  # (what, regex a survivor's stderr must hold)
    violations: list[str] = field(default_factory=list)
    frozen: set[str] = field(default_factory=set)  # the nodes it froze
    victims: list[str] = field(default_factory=list)  # the node each landed fault struck (the store: "store")
    cuts: list[tuple[str, float, float]] = field(default_factory=list)  # (node, when, how long) its link was cut
    seconds: float = 0.0
    kept: Path | None = None  # --keep: the episode's folder


@dataclass
class World:
    """What the faults strike: the agents, the store, the hosts, the log disk; timers that undo a fault later."""

    agents: list[Proc]
    store: C10dStore | EtcdCluster
    net: Net | None
    disk: Path | None
    timers: list[threading.Timer] = field(default_factory=list)
    cut_for_good: set[tuple[int, str]] = field(default_factory=set)  # (node, end) links down until the end

    def later(self, delay: float, fn, *args) -> None:
        t = threading.Timer(delay, fn, args=args)
        t.daemon = True
        self.timers.append(t)
        t.start()

    def mend(self, node: int, at: str) -> None:
        """The end of a temporary cut: the link up again, unless it was cut for good meanwhile."""
        if (node, at) not in self.cut_for_good:
            self.net.link(node, at, "up")


def plan(backend: str, seed: int, skip: set[Fault] = frozenset(), shape: Shape = Shape.ELASTIC) -> Episode:
    """The seed's faults: 1 or 2, at 0-1.5 s after every worker runs, at most one on the store."""
    rng = random.Random(seed)
    ep = Episode(backend, seed, shape)
    kinds = [f for f in FAULTS[backend] if f not in skip]
    for _ in range(rng.choice((1, 1, 2))):
        fault = rng.choice(kinds)
        if fault in STORE_FAULTS:
            kinds = [f for f in kinds if f not in STORE_FAULTS]
        ep.faults.append((round(rng.uniform(0.0, 1.5), 3), fault))
    ep.faults.sort(key=lambda f: f[0])
    return ep


def run_episode(ep: Episode, bound: float, keep: bool = False, verbose: bool = False, netns: bool = False) -> Episode:
    rng = random.Random(ep.seed * 7919 + 1)  # victims, lengths and pauses
    began = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix=f"chaos-{ep.backend}-{ep.seed}-"))
    ckpt, logs = folder / "ckpt", folder / "logs"
    ckpt.mkdir()
    logs.mkdir()
    mounted = False
    net = store = world = None
    agents: list[Proc] = []
    try:
        if any(f is Fault.DISK_FULL for _, f in ep.faults):
            mounted = (
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(logs)], capture_output=True
                ).returncode
                == 0
            )
        net = Net(f"chaos{os.getpid()}-{ep.seed}") if netns else None
        addr, hub = (f"{SUBNET}.1", net.hub) if net else ("127.0.0.1", None)
        store = C10dStore(addr, hub) if ep.backend == "c10d" else EtcdCluster(folder, addr, hub)
        # join_timeout and replace_timeout inside the bound: nodes left below MIN wait for replacements that
        # long (a re-forming elastic job; a fixed-size one that lost a member with no spare left), then say so
        conf = (
            f"last_call_timeout=1,read_timeout={READ_TIMEOUT:g},join_timeout=20,replace_timeout=20,"
            f"keep_alive_max_attempt={LIVENESS / 0.5:.0f}" + (",is_host=false" if ep.backend == "c10d" else "")
        )
        spares = ep.shape is Shape.SPARES
        args = [
            sys.executable,
            "-m",
            "launcher",
            "--nnodes",
            "2" if spares else "2:3",
            "--nproc_per_node",
            "2",
            "--max_restarts",
            "3",
            "--rdzv_backend",
            ep.backend,
            "--rdzv_endpoint",
            store.endpoint,
            "--rdzv_id",
            f"chaos{ep.shape.value}{ep.seed}",
            "--rdzv_conf",
            conf,
            "--log_dir",
            str(logs),
            str(STEPS),
        ]
        # 4 s of training; 12 s with a link cut (a cut node may give up while its workers run), 20 s with a
        # link down for good (a node that never gives up runs its workers past STOP_S)
        kinds = {f for _, f in ep.faults}
        steps = 400 if Fault.LINK_DOWN in kinds else 240 if Fault.LINK_CUT in kinds else 80
        env = {"CKPT_DIR": str(ckpt), "STEPS": str(steps), "STEP_TIME": "0.05"}
        members = 2 if spares else NODES  # the spares shape starts its third node once the two members run
        if spares:  # quarantine at the first failure; each agent its own node name (they share a host name)
            args[args.index(str(STEPS)) : args.index(str(STEPS))] = ["--quarantine", "after=1,window=2"]

        def node_env(i: int) -> dict[str, str]:
            return env | ({"SLURMD_NODENAME": f"node{i}"} if spares else {})

        agents = [Proc(f"node{i}", args, node_env(i), net.nodes[i] if net else None) for i in range(members)]
        world = World(agents, store, net, logs if mounted else None)
        t_start = time.monotonic()
        while sum(len(a.starts()) for a in agents) < 2 * members:
            if time.monotonic() - t_start > bound / 2:
                ep.violations.append("the job never started: not every worker of the first round ran")
                return ep
            time.sleep(0.02)
        if spares:
            agents.append(Proc(f"node{members}", args, node_env(members), net.nodes[members] if net else None))
            while not any("waiting as a spare" in line for line in agents[-1].err):
                if time.monotonic() - t_start > bound / 2 or agents[-1].popen.poll() is not None:
                    ep.violations.append(f"the third node never said it waits as a spare: {agents[-1].err[-3:]}")
                    return ep
                time.sleep(0.02)
        t0 = time.monotonic()
        for at, fault in ep.faults:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            inject(ep, fault, world, rng)
        deadline = t0 + bound
        rcs = {a.name: (a.finish(deadline - time.monotonic()) if not a.killed else -9) for a in agents}
        check(ep, agents, rcs, ckpt)
        if ep.violations and verbose:
            for a in agents:
                print(f"----- {a.name} rc={rcs[a.name]}\n" + "\n".join(a.err[-30:]), flush=True)
    except Exception as e:  # the harness itself: reported as a violation, never swallowed
        ep.violations.append(f"harness error: {type(e).__name__}: {e}")
    finally:
        for t in world.timers if world else []:
            t.cancel()
        for a in agents:
            a.kill_all()
        if store is not None:
            store.close()
        if net is not None:
            net.close()
        if mounted:
            subprocess.run(["umount", "-l", str(logs)], capture_output=True)
        if keep:  # the agents' output beside their logs and checkpoint
            for a in agents:
                (folder / f"{a.name}.out").write_text("\n".join(a.out))
                (folder / f"{a.name}.err").write_text("\n".join(a.err))
            ep.kept = folder
        else:
            shutil.rmtree(folder, ignore_errors=True)
        ep.seconds = time.monotonic() - began
    return ep


def inject(ep: Episode, fault: Fault, w: World, rng: random.Random) -> None:
    alive = [a for a in w.agents if not a.killed and a.popen.poll() is None]
    if not alive:
        return
    victim = rng.choice(alive)
    landed = len(ep.done)
    if fault is Fault.WORKER_KILL:
        workers = victim.workers()
        if workers:
            pid = rng.choice(workers)
            signal_all([pid], signal.SIGKILL)
            ep.done.append(f"SIGKILL worker {pid} of {victim.name}")
            why = rf"pid {pid}|killed by SIGKILL|: failure\)|quarantined: its workers failed"  # spares: quarantined
            ep.expect.append(("the killed worker", why))
    elif fault is Fault.AGENT_KILL:
        signal_all([victim.popen.pid], signal.SIGKILL)
        victim.killed = True
        ep.done.append(f"SIGKILL agent {victim.name}")
        ep.expect.append(("the killed agent", r"died|lost its lease|stopped heartbeating|no node came to fill"))
    elif fault is Fault.NODE_FREEZE:
        pids = [victim.popen.pid, *victim.workers()]
        signal_all(pids, signal.SIGSTOP)
        length = rng.uniform(2.5, 4.0)
        w.later(length, signal_all, pids, signal.SIGCONT)
        ep.done.append(f"SIGSTOP {victim.name} for {length:.1f} s")
        ep.frozen.add(victim.name)
        ep.expect.append(("the frozen node", r"stopped heartbeating|lost its lease"))
    elif fault is Fault.STORE_KILL and isinstance(w.store, C10dStore):
        w.store.close()
        ep.done.append("store SIGKILLed")
        ep.expect.append(("the lost store", r"rendezvous store"))
    elif fault is Fault.STORE_KILL:
        for i in range(len(w.store.procs)):
            w.store.kill(i)
        pause = rng.uniform(0.2, 1.5)
        time.sleep(pause)
        w.store.start_all()
        ep.done.append(f"every etcd member killed, restarted after {pause:.1f} s")
        ep.expect.append(("the etcd outage", r"etcd at"))  # out longer than read_timeout: the nodes give up on it
    elif fault in (Fault.MEMBER_KILL, Fault.LEADER_KILL):
        leader = w.store.leader()
        if leader is not None:
            i = (
                leader
                if fault is Fault.LEADER_KILL
                else rng.choice([m for m in range(len(w.store.procs)) if m != leader])
            )
            pause = rng.uniform(0.5, 3.0)
            w.store.kill(i)
            w.later(pause, w.store.start, i)
            ep.done.append(
                f"etcd {'leader' if i == leader else 'follower'} m{i} SIGKILLed, back on its data after {pause:.1f} s"
            )
    elif fault is Fault.DISK_FULL and w.disk is not None:
        subprocess.run(["dd", "if=/dev/zero", f"of={w.disk / 'filler'}", "bs=64k"], capture_output=True)
        ep.done.append("log disk filled")
    elif fault in LINK_FAULTS and w.net is not None:
        node, at = w.agents.index(victim), rng.choice(("node", "hub"))
        length = rng.uniform(1.0, 12.0) if fault is Fault.LINK_CUT else float("inf")
        w.net.link(node, at, "down")
        if length < float("inf"):
            w.later(length, w.mend, node, at)
        else:
            w.cut_for_good.add((node, at))
        ep.cuts.append((victim.name, time.monotonic(), length))
        ep.done.append(
            f"link of {victim.name} cut at the {at} " + (f"for {length:.1f} s" if length < float("inf") else "for good")
        )
        ep.expect.append(("the cut link", r"stopped heartbeating|lost its lease|died|no node came to fill"))
    if len(ep.done) > landed:
        ep.landed.append(fault)
        ep.victims.append("store" if fault in STORE_FAULTS else victim.name)


DISTURBED = re.compile(r"membership changed|restarting|reason: |exited with|killed by|rendezvous store")
STORE_LOST = re.compile(r"reason: .*(?:rendezvous store|etcd at)")  # a node cut off for good says what it lost
CUT_REASON = re.compile(rf"{STORE_LOST.pattern}|reason: .*the job was closed")  # back in time, it may find the job over


def check(ep: Episode, agents: list[Proc], rcs: dict[str, int | None], ckpt: Path) -> None:
    v = ep.violations
    live = [a for a in agents if not a.killed]
    cut = {name: STORE_LOST if length == float("inf") else CUT_REASON for name, _, length in ep.cuts}
    for a in live:  # finish, or a clear reason, within the bound
        rc = rcs[a.name]
        text = "\n".join(a.err)
        if rc is None:
            v.append(f"{a.name} still running after the bound")
        elif "Traceback" in text:
            v.append(f"{a.name}: a Python traceback on the agent's stderr")
        elif rc != 0 and not re.search(r"reason: |error: ", text):
            v.append(f"{a.name}: exit {rc} with no reason given")
        elif rc != 0 and a.name in cut and not cut[a.name].search(text) and not (rc == 69 and QUARANTINED.search(text)):
            v.append(
                f"{a.name}: its link was cut and it gave up, but its reason does not name what it lost: "
                f"{[line for line in a.err if 'reason: ' in line]}"
            )
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
    restarts = max((int(s["restart"]) for seen in by_round.values() for s in seen), default=0)
    killed = ep.landed.count(Fault.WORKER_KILL)
    if ep.shape is Shape.SPARES:  # a lost member is charged too (fixed size: below MIN), once per loss
        lost = sum(f in STOPS_A_NODE for f in ep.landed)
        if restarts > killed + lost:
            v.append(f"{restarts} restart(s) charged, but {killed} worker(s) killed and {lost} node(s) stopped")
        check_spares(ep, agents, rcs, by_round)
    elif restarts > killed:  # only a failed worker is charged to the budget
        v.append(f"{restarts} restart(s) charged, but {killed} worker(s) killed")
    if ep.landed and all(f in RIDDEN_OUT for f in ep.landed):  # ridden out: as if nothing happened
        if len(by_round) != 1 or any(rcs[a.name] != 0 for a in agents):
            v.append(f"{'; '.join(ep.done)}: not ridden out: rounds {sorted(by_round)}, exits {rcs}")
    causes = "|".join(f"(?:{rx})" for _, rx in ep.expect) or r"(?!)"
    for a in live:  # the true cause named: what first disturbed each survivor is one of the faults
        if a.name in ep.frozen or a.name in cut:
            continue  # it missed the change it wakes to, or gave up on the store it lost; the others name why
        first = next((line for line in a.err if DISTURBED.search(line)), None)
        if first is not None and not re.search(causes, first):
            v.append(f"{a.name} named a cause that was not injected: {first!r} (injected: {'; '.join(ep.done)})")
    # what the others said (a frozen or cut node speaks of what it lost; a spare's loss disturbs nobody)
    said = [
        line for a in live if a.name not in ep.frozen and a.name not in cut for line in a.err if DISTURBED.search(line)
    ]
    if (
        said and len(ep.expect) == 1 and not any(re.search(causes, line) for line in said)
    ):  # two faults: one may hide the other
        v.append(f"no survivor named {ep.expect[0][0]}; they said: {said[:3]}")
    check_cut(ep, agents, rcs)
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
            m = re.search(
                r"\[rank(\d+)\]: (start|step) rank=\d+ (?:world=\S+ restart=\S+ round=\S+ from=(\d+)|n=(\d+))", line
            )
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


def check_spares(ep: Episode, agents: list[Proc], rcs: dict[str, int | None], by_round: dict) -> None:
    """A fixed-size job with a spare: the world never changes; a member lost while the spare is untouched
    is replaced by it; every node left untouched ends with the job's verdict, the spare included."""
    v, spare = ep.violations, agents[-1]
    worlds = {s["world"] for seen in by_round.values() for s in seen}
    if worlds - {"4"}:
        v.append(f"a fixed-size job of 2 x 2 workers ran at world size {sorted(worlds)}")
    touched = {name for name in ep.victims} | ep.frozen | {name for name, _, _ in ep.cuts}
    # Surely lost: killed, or cut past the liveness timeout (a freeze of 2.5-4 s may or may not outlast it).
    long_cuts = {name for name, _, length in ep.cuts if length >= LIVENESS + 2.0}
    quarantined: dict[str, float] = {}  # node -> when it said it is quarantined (and leaves, exit 69)
    for a in agents:  # no quarantined node is admitted: it leaves, and runs no worker again
        mark = f"launcher: {a.name} is quarantined: "
        at = next((t for line, t in zip(list(a.err), list(a.err_at)) if mark in line), None)
        if at is None:
            continue
        quarantined[a.name] = at
        if rcs[a.name] not in (69, None) and not a.killed:
            v.append(f"{a.name} was quarantined but exited {rcs[a.name]}, not 69")
        late = [s for s in a.starts() if s["at"] > at]
        if late:
            v.append(f"{a.name} was quarantined but ran workers again: {late[0]}")
    members_lost = [
        name
        for name, fault in zip(ep.victims, ep.landed)
        if name != spare.name
        and (fault is Fault.AGENT_KILL or (fault in LINK_FAULTS and name in long_cuts) or name in quarantined)
    ]
    if members_lost and spare.name not in touched and len(ep.landed) == 1 and not spare.starts():
        v.append(f"{members_lost[0]} was lost and the spare stood by, but the spare never ran workers")
    untouched = {a.name: rcs[a.name] for a in agents if a.name not in touched and not a.killed}
    if len(set(untouched.values())) > 1:
        v.append(f"the nodes left untouched end with different verdicts: {untouched}")


def check_cut(ep: Episode, agents: list[Proc], rcs: dict[str, int | None]) -> None:
    """A node whose link is down for good stops its workers within STOP_S of the cut (its last worker
    line). A link cut past the liveness timeout, the episode's only fault that stops a node: each other
    node runs a round without the cut one, or has finished, within the liveness timeout + REFORM_S."""
    for name, at, length in ep.cuts:
        a = next(a for a in agents if a.name == name)
        last = a.out_at[-1] if a.out_at and not a.killed else None
        if length == float("inf") and last is not None and last > at + STOP_S:
            ep.violations.append(
                f"{name}: cut off for good, its workers still ran {last - at:.0f} s after the cut "
                f"(at most {STOP_S:g} s)"
            )
    stops = STOPS_A_NODE | (QUARANTINES if ep.shape is Shape.SPARES else set())
    if len(ep.cuts) != 1 or sum(f in stops for f in ep.landed) != 1:
        return
    name, at, length = ep.cuts[0]
    if length < LIVENESS + 2.0:  # shorter: heartbeats late by TCP's backoff may or may not drop it
        return
    if not any(s["at"] < at for a in agents if a.name == name for s in a.starts()):
        return  # a spare that ran no workers yet: its loss ends no round
    by = at + LIVENESS + REFORM_S
    rounds_of_cut = {s["round"] for a in agents if a.name == name for s in a.starts()}
    for a in agents:
        if a.name == name:
            continue
        reformed = any(at < s["at"] <= by and s["round"] not in rounds_of_cut for s in a.starts())
        finished = rcs[a.name] == 0 and a.ended_at is not None and a.ended_at <= by
        if not (reformed or finished):
            ep.violations.append(
                f"{a.name}: neither re-formed without {name} nor finished within {LIVENESS:g} + {REFORM_S:g} s "
                f"of its link's cut ({length:.1f} s)"
            )


def campaign(backend: str, shape: Shape, seed: int, args: argparse.Namespace, skip: set[Fault], netns: bool) -> int:
    """--episodes episodes of one backend and shape, each reported; how many had violations."""
    label = backend if shape is Shape.ELASTIC else f"{backend} {shape.value}"
    bad, landed, seconds = 0, Counter(), 0.0
    for i in range(args.episodes):
        ep = run_episode(plan(backend, seed + i, skip, shape), args.bound, args.keep, args.verbose, netns)
        status = "ok" if not ep.violations else "VIOLATION"
        print(
            f"chaos: {label} seed {ep.seed}: {status} ({ep.seconds:.0f} s): "
            f"{'; '.join(ep.done) or 'no fault landed'}" + (f" (kept in {ep.kept})" if ep.kept else ""),
            flush=True,
        )
        for line in ep.violations:
            print(
                f"chaos:   {line}   (replay: --backend {backend} --shape {shape.value} --seed {ep.seed} --episodes 1)",
                flush=True,
            )
        bad += bool(ep.violations)
        landed.update(ep.landed)
        seconds += ep.seconds
    counts = ", ".join(f"{f.value} {landed[f]}" for f in FAULTS[backend] if f not in skip)
    print(
        f"chaos: {label}: faults landed: {counts}; {seconds / max(1, args.episodes):.1f} s per episode",
        flush=True,
    )
    print(f"chaos: {label}: {args.episodes} episodes, {bad} with violations", flush=True)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="c10d,etcd")
    ap.add_argument("--episodes", type=int, default=20, help="per backend and shape")
    ap.add_argument(
        "--shape", default="elastic,spares", help="elastic (--nnodes 2:3), spares (--nnodes 2 and a spare), or both"
    )
    ap.add_argument(
        "--seed", type=int, default=None, help="first episode's seed (default: from the clock); episode i uses seed+i"
    )
    ap.add_argument(
        "--bound", type=float, default=60.0, help="seconds from the first fault until every node must have ended"
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep each episode's folder (logs, checkpoint, the agents' output)"
    )
    ap.add_argument("--verbose", action="store_true", help="print the agents' stderr on a violation")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped campaign still cleans its episode up
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    netns = netns_usable()
    skip = set()
    if not (IS_ROOT and shutil.which("mount")):
        skip.add(Fault.DISK_FULL)
    if not netns:
        skip.add(Fault.LINK_CUT)
    else:
        sweep_namespaces()
    print(
        f"chaos: seed {seed}, {args.episodes} episode(s) per backend ({args.backend}); "
        "replay one: --seed S --episodes 1"
        + (f"; skipped (needs root, mount, ip netns): {', '.join(sorted(f.value for f in skip))}" if skip else ""),
        flush=True,
    )
    total = 0
    for backend in args.backend.split(","):
        if backend == "etcd" and not shutil.which("etcd"):
            print("chaos: etcd: no etcd binary on PATH, skipped", flush=True)
            continue
        for shape in [Shape(name) for name in args.shape.split(",")]:
            total += campaign(backend, shape, seed, args, skip, netns)
    return 1 if total else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the episode under way cleaned up on the way out
        print("chaos: interrupted", flush=True)
        sys.exit(130)
