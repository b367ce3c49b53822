"""The fault kinds: a seed's schedule of faults, and what each kind does to the episode's processes, store and links."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .net import Net
from .proc import Proc, signal_all
from .records import (
    FAULTS,
    FOR_GOOD,
    HANG_TIMEOUT,
    IN_PLACE_FAULTS,
    IN_PLACE_STEP_COUNT,
    JOIN_DELAY,
    SELF_INFLICTED,
    STORE_FAULTS,
    Die,
    Episode,
    Event,
    Fault,
    Shape,
    StepLine,
    in_place_world,
)
from .stores import C10dStore, EtcdCluster


@dataclass
class World:
    """What the faults strike: the agents, the store, the hosts, the log disk; timers that undo a fault later."""

    agents: list[Proc]
    store: C10dStore | EtcdCluster
    net: Net | None
    disk: Path | None
    steplog: Path | None = None  # in-place: the workers' step logs, <rank>.<pid>
    timers: list[threading.Timer] = field(default_factory=list)
    cut_for_good: set[tuple[int, str]] = field(default_factory=set)  # (node, end) links down until the end

    def later(self, delay: float, fn, *args) -> None:
        """Call fn(*args) in `delay` s (cancelled when the episode ends)."""
        t = threading.Timer(delay, fn, args=args)
        t.daemon = True
        self.timers.append(t)
        t.start()

    def mend(self, node: int, at: str) -> None:
        """The end of a temporary cut: the link up again, unless it was cut for good meanwhile."""
        if (node, at) not in self.cut_for_good:
            self.net.link(node, at, "up")


def plan(backend: str, seed: int, skip: set[Fault] = frozenset(), shape: Shape = Shape.ELASTIC) -> Episode:
    """The seed's faults: 1 or 2, at 0-1.5 s after every worker runs, at most one on the store. In place: at
    0-2.5 s; a self-inflicted kind is a DIE_AT entry instead (a rank, and for after-commit a step), and a
    recovery-fault has replacements wait JOIN_DELAY s before they join (the second kill lands in the recovery)."""
    rng = random.Random(seed)
    ep = Episode(backend, seed, shape)
    in_place = shape is Shape.IN_PLACE
    kinds = [f for f in (IN_PLACE_FAULTS if in_place else FAULTS[backend]) if f not in skip]
    ep.spare = in_place and Fault.AGENT_KILL in kinds  # a member's agent lost: two members and a spare
    for _ in range(rng.choice((1, 1, 2))):
        fault = rng.choice(kinds)
        if fault in STORE_FAULTS:
            kinds = [f for f in kinds if f not in STORE_FAULTS]
        # in place, spread over 2.5 s: a second kill mostly lands after the first one's recovery
        ep.faults.append((round(rng.uniform(0.0, 2.5 if in_place else 1.5), 3), fault))
        if fault in SELF_INFLICTED:
            rank = rng.randrange(in_place_world(ep.spare))
            at_step = rng.randint(1, IN_PLACE_STEP_COUNT - 2) if fault is Fault.AFTER_COMMIT else 0
            ep.dies.append(Die(rank, at_step, fault.value))
        elif fault is Fault.RECOVERY_FAULT:
            ep.join_delay = JOIN_DELAY
    ep.faults.sort(key=lambda f: f[0])
    return ep


# Each kind strikes `victim` (a live agent, drawn first whatever the kind) and, when it lands, says what it
# did in ep.done and what a survivor should name in ep.expect. Every draw from `rng` is part of the seed's
# replay: keep their order.
Strike = Callable[[Episode, World, Proc, random.Random], None]


def kill_worker(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """worker-kill: one of the victim's workers SIGKILLed."""
    workers = victim.workers()
    if workers:
        pid = rng.choice(workers)
        signal_all([pid], signal.SIGKILL)
        ep.done.append(f"SIGKILL worker {pid} of {victim.name}")
        why = rf"pid {pid}|killed by SIGKILL|: failure\)|quarantined: its workers failed"  # spares: quarantined
        ep.expect.append(("the killed worker", why))


def kill_agent(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """agent-kill: the victim agent SIGKILLed (its guard stops its workers)."""
    signal_all([victim.popen.pid], signal.SIGKILL)
    victim.killed = True
    ep.done.append(f"SIGKILL agent {victim.name}")
    ep.expect.append(("the killed agent", r"died|lost its lease|stopped heartbeating|no node came to fill"))


def freeze_node(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """node-freeze: SIGSTOP on the victim agent and its workers, SIGCONT 2.5-4 s later."""
    pids = [victim.popen.pid, *victim.workers()]
    signal_all(pids, signal.SIGSTOP)
    length = rng.uniform(2.5, 4.0)
    w.later(length, signal_all, pids, signal.SIGCONT)
    ep.done.append(f"SIGSTOP {victim.name} for {length:.1f} s")
    ep.frozen.add(victim.name)
    ep.expect.append(("the frozen node", r"stopped heartbeating|lost its lease"))


def kill_store(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """store-kill: c10d, the store SIGKILLed for good; etcd, every member killed and restarted on its data."""
    if isinstance(w.store, C10dStore):
        w.store.close()
        ep.done.append("store SIGKILLed")
        ep.expect.append(("the lost store", r"rendezvous store"))
        return
    for i in range(len(w.store.procs)):
        w.store.kill(i)
    pause = rng.uniform(0.2, 1.5)
    time.sleep(pause)
    w.store.start_all()
    ep.done.append(f"every etcd member killed, restarted after {pause:.1f} s")
    ep.expect.append(("the etcd outage", r"etcd at"))  # out longer than read_timeout: the nodes give up on it


def kill_etcd_member(ep: Episode, w: World, victim: Proc, rng: random.Random, leader_too: bool = False) -> None:
    """etcd-member-kill: a follower SIGKILLed, restarted on its data dir 0.5-3 s later (quorum is kept)."""
    leader = w.store.leader()
    if leader is None:
        return
    i = leader if leader_too else rng.choice([m for m in range(len(w.store.procs)) if m != leader])
    pause = rng.uniform(0.5, 3.0)
    w.store.kill(i)
    w.later(pause, w.store.start, i)
    ep.done.append(
        f"etcd {'leader' if i == leader else 'follower'} m{i} SIGKILLed, back on its data after {pause:.1f} s"
    )


def kill_etcd_leader(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """etcd-leader-kill: the leader (by etcd's /v3/maintenance/status) SIGKILLed, restarted 0.5-3 s later."""
    kill_etcd_member(ep, w, victim, rng, leader_too=True)


def fill_disk(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """disk-full: the --log_dir disk (a 2 MiB tmpfs, as root) filled."""
    if w.disk is None:
        return
    subprocess.run(["dd", "if=/dev/zero", f"of={w.disk / 'filler'}", "bs=64k"], capture_output=True)
    ep.done.append("log disk filled")


def cut_link(ep: Episode, w: World, victim: Proc, rng: random.Random, for_good: bool = False) -> None:
    """link-cut: the victim's link set down, at the node or at the hub's bridge, for 1-12 s (namespaces only)."""
    if w.net is None:
        return
    node, at = w.agents.index(victim), rng.choice(("node", "hub"))
    length = FOR_GOOD if for_good else rng.uniform(1.0, 12.0)
    w.net.link(node, at, "down")
    if length < FOR_GOOD:
        w.later(length, w.mend, node, at)
    else:
        w.cut_for_good.add((node, at))
    ep.cuts.append((victim.name, time.monotonic(), length))
    ep.done.append(
        f"link of {victim.name} cut at the {at} " + (f"for {length:.1f} s" if length < FOR_GOOD else "for good")
    )
    ep.expect.append(("the cut link", r"stopped heartbeating|lost its lease|died|no node came to fill"))


def link_down(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """link-down: as link-cut, down until the episode ends."""
    cut_link(ep, w, victim, rng, for_good=True)


def stepping(w: World, victim: Proc) -> list[tuple[int, int]]:
    """In place: (rank, pid) of the victim's workers now, each rank's newest process by the step logs."""
    mine, newest = set(victim.left()), {}
    for f in sorted(w.steplog.iterdir(), key=lambda f: f.stat().st_mtime):
        rank, pid = map(int, f.name.split("."))
        if pid in mine:
            newest[rank] = pid
    return sorted(newest.items())


def workers_of(w: World, victim: Proc) -> tuple[Proc, list[tuple[int, int]]]:
    """The victim and its stepping workers; a spare that runs none: the first agent that does, and its."""
    for a in [victim, *(a for a in w.agents if a is not victim)]:
        workers = stepping(w, a)
        if workers:
            return a, workers
    return victim, []


def kill_in_place(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """worker-kill, in place: one of the victim's stepping workers SIGKILLed."""
    victim, workers = workers_of(w, victim)
    if workers:
        rank, pid = rng.choice(workers)
        signal_all([pid], signal.SIGKILL)
        ep.struck.add(pid)
        ep.done.append(f"SIGKILL rank {rank} (pid {pid}) of {victim.name}")
        # across nodes the others say "rank 2 (local rank 0) on HOST killed by SIGKILL"
        ep.expect.append(("the killed worker", rf"rank {rank}\b.*killed by SIGKILL|pid {pid}"))


def freeze_worker(ep: Episode, w: World, victim: Proc, rng: random.Random, hang: bool = False) -> None:
    """worker-freeze: one of the victim's workers SIGSTOPped for 0.2-1.5 s, well under --hang_timeout."""
    victim, workers = workers_of(w, victim)
    if not workers:
        return
    rank, pid = rng.choice(workers)
    length = HANG_TIMEOUT + 2.0 if hang else rng.uniform(0.2, 1.5)
    signal_all([pid], signal.SIGSTOP)
    w.later(length, signal_all, [pid], signal.SIGCONT)  # a hang: the agent's SIGABRT lands once it runs
    ep.done.append(f"SIGSTOP rank {rank} (pid {pid}) of {victim.name} for {length:.1f} s")
    if hang:
        ep.struck.add(pid)
        # The ranks waiting on it in the all-reduce go silent with it, on every node: any of them may be
        # judged first, and its node restarts the group (in place cannot tell them apart; docs/in-place.md).
        # A survivor frozen by it cannot join an in-place round: that round's wait runs out (in_place_failed)
        # and the group restarts as a membership round, which a node not involved names so.
        silent = r"went silent at once|group rank 0\) was lost or restarted|made no progress|hung: no progress"
        silent += r"|did not finish within|re-forms the group"
        ep.expect.append(("the hung worker", rf"rank {rank} (?:made no progress|hung)|{silent}"))


def hang_worker(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """worker-hang: one of the victim's workers SIGSTOPped past --hang_timeout (then SIGCONT)."""
    freeze_worker(ep, w, victim, rng, hang=True)


def kill_member(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """agent-kill, in place with a spare: a member's agent SIGKILLed (its guard stops its workers); the
    spare's workers take its ranks."""
    members = [a for a in w.agents[:2] if not a.killed and a.popen.poll() is None]
    if not members:
        return
    victim = rng.choice(members)
    workers = stepping(w, victim)
    signal_all([victim.popen.pid], signal.SIGKILL)
    victim.killed = True
    ep.struck.update(pid for _, pid in workers)
    ep.done.append(f"SIGKILL agent {victim.name} (ranks {[r for r, _ in workers]})")
    # The node serving the workers' store (group rank 0) takes it with it: a documented group restart.
    ep.expect.append(
        ("the killed agent", r"died|lost its lease|stopped heartbeating|no node came to fill|group rank 0\) was lost")
    )


def armed(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """after-commit, startup, teardown: nothing at the time; the worker strikes itself where DIE_AT says, and
    its "die" line says it landed (`self_inflicted`, once the episode is over)."""


def kill_two(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """two-ranks: two of the victim's stepping workers SIGKILLed 40-70 ms apart (one fault: one restart)."""
    victim, workers = workers_of(w, victim)
    workers = [(r, p) for r, p in workers if p not in ep.struck]
    gap = rng.uniform(0.04, 0.07)
    if len(workers) < 2:
        return
    pair = rng.sample(workers, 2)
    began = time.monotonic()
    signal_all([pair[0][1]], signal.SIGKILL)
    time.sleep(max(0.0, began + gap - time.monotonic()))
    signal_all([pair[1][1]], signal.SIGKILL)
    ep.struck.update(p for _, p in pair)
    ep.done.append(f"SIGKILL ranks {pair[0][0]} and {pair[1][0]} of {victim.name} {gap * 1000:.0f} ms apart")
    for rank, pid in pair:
        ep.expect.append(("the killed workers", rf"rank {rank}\b.*killed by SIGKILL|pid {pid}"))


SPAWN_WAIT = 15.0  # s a recovery-fault waits for the first kill's replacement to be spawned


def events_now(w: World) -> list[Event]:
    """Every agent's events so far (in place: --log_dir's events-<node>.jsonl, beside the step logs)."""
    found: list[Event] = []
    for a in w.agents:
        path = w.steplog.parent / f"events-{a.name}.jsonl"
        text = path.read_text() if path.exists() else ""
        found += [e for e in map(Event.parse, text.splitlines()) if e is not None]
    return found


def kill_in_recovery(ep: Episode, w: World, victim: Proc, rng: random.Random) -> None:
    """recovery-fault: a stepping worker SIGKILLed, then, 0-0.3 s after its replacement's `spawn` and before
    that round's `recovered`, another (a survivor or the replacement; replacements wait JOIN_DELAY s)."""
    delay, pick = rng.uniform(0.0, 0.3), rng.random()
    before, began = len(ep.done), time.time()
    kill_in_place(ep, w, victim, rng)
    if len(ep.done) == before:
        return
    deadline = time.monotonic() + SPAWN_WAIT
    spawn = None
    while spawn is None and time.monotonic() < deadline:
        spawn = next((e for e in events_now(w) if e.kind == "spawn" and e.at >= began), None)
        time.sleep(0.005)
    if spawn is None:
        ep.done.append(f"no replacement spawned within {SPAWN_WAIT:g} s: no second kill")
        return
    seen = time.monotonic()
    survivors = [(r, p) for a in w.agents for r, p in stepping(w, a) if p not in ep.struck and r != spawn.rank]
    rank, pid = sorted([*survivors, (spawn.rank, spawn.pid)])[int(pick * (len(survivors) + 1))]
    time.sleep(max(0.0, seen + delay - time.monotonic()))
    if any(e.kind == "recovered" and e.round == spawn.round for e in events_now(w)):
        ep.done.append(f"round {spawn.round} recovered within {delay:.2f} s of its spawn: no second kill")
        return
    signal_all([pid], signal.SIGKILL)
    ep.struck.add(pid)
    who = "the replacement" if pid == spawn.pid else "a survivor"
    ep.done.append(f"then SIGKILL rank {rank} (pid {pid}, {who}) {delay:.2f} s into round {spawn.round}'s recovery")
    ep.expect.append(("the second killed worker", rf"rank {rank}\b.*killed by SIGKILL|pid {pid}"))


def self_inflicted(ep: Episode, lines: list[StepLine]) -> None:
    """Record the self-inflicted faults that landed, in order, from the step logs' "die" lines."""
    for d in sorted((x for x in lines if x.kind == "die"), key=lambda x: x.at):
        ep.landed.append(Fault(d.phase))
        ep.victims.append(f"rank {d.rank}")
        ep.struck.add(d.pid)
        ep.done.append(f"rank {d.rank} (pid {d.pid}) SIGKILLed itself at {d.phase} ({d.step} steps done)")
        ep.expect.append((f"the {d.phase} death", rf"rank {d.rank}\b.*killed by SIGKILL|pid {d.pid}"))


IN_PLACE_STRIKES: dict[Fault, Strike] = {
    Fault.WORKER_KILL: kill_in_place,
    Fault.WORKER_FREEZE: freeze_worker,
    Fault.WORKER_HANG: hang_worker,
    Fault.AGENT_KILL: kill_member,
    Fault.AFTER_COMMIT: armed,
    Fault.STARTUP: armed,
    Fault.TEARDOWN: armed,
    Fault.TWO_RANKS: kill_two,
    Fault.RECOVERY_FAULT: kill_in_recovery,
}

STRIKES: dict[Fault, Strike] = {
    Fault.WORKER_KILL: kill_worker,
    Fault.AGENT_KILL: kill_agent,
    Fault.NODE_FREEZE: freeze_node,
    Fault.STORE_KILL: kill_store,
    Fault.DISK_FULL: fill_disk,
    Fault.LINK_CUT: cut_link,
    Fault.LINK_DOWN: link_down,
    Fault.MEMBER_KILL: kill_etcd_member,
    Fault.LEADER_KILL: kill_etcd_leader,
}


def inject(ep: Episode, fault: Fault, w: World, rng: random.Random) -> None:
    """Strike with `fault` at a live agent drawn from `rng`; a fault that landed is recorded with its victim."""
    alive = [a for a in w.agents if not a.killed and a.popen.poll() is None]
    if not alive:
        return
    victim = rng.choice(alive)
    landed = len(ep.done)
    (IN_PLACE_STRIKES if ep.shape is Shape.IN_PLACE else STRIKES)[fault](ep, w, victim, rng)
    if len(ep.done) > landed:
        ep.landed.append(fault)
        ep.victims.append("store" if fault in STORE_FAULTS else victim.name)
