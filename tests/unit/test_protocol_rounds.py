"""The rendezvous protocol against an in-memory store: `assign()` as a pure function, and
`ElasticRendezvous` rounds, last call, timeouts, the restart budget, closing and join tokens.
A store wait that would block on a single node instead moves a fake clock on by its timeout,
so last call and join timeouts take no real time."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from support.clock import FakeClock

from launcher.errors import RendezvousClosedError, RendezvousError, RendezvousTimeoutError, RestartBudgetExhausted
from launcher.rendezvous.api import Cause, MembershipChanged, WaitKind
from launcher.rendezvous.protocol import LOOK_EVERY, WAIT_REPORT_EVERY, ElasticRendezvous
from launcher.rendezvous.records import MAX_VERDICT, Node, assign, decode_verdict, encode_verdict, token_check
from launcher.rendezvous.settings import RendezvousSettings
from launcher.spec import Verdict

SETTINGS = RendezvousSettings(join_timeout=60, last_call_timeout=5, read_timeout=2)


class MemoryStore:
    """The protocol's store operations over a dict. With a `clock`, a wait that is not satisfied
    returns at once and moves the clock on by its timeout (one node, simulated time); without one,
    it blocks on a condition until another thread writes (several nodes, real time)."""

    def __init__(self, clock: FakeClock | None = None):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.clock = clock
        self.ops = 0

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            self.ops += 1
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def get(self, key: str) -> bytes | None:
        with self.cond:
            self.ops += 1
            return self.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.ops += 1
            self.data[key] = value
            self.cond.notify_all()

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self.cond:
            self.ops += 1
            now = self.data.get(key)
            if (now is None and expected == b"") or now == expected:
                self.data[key] = now = desired
                self.cond.notify_all()
            return now

    def wait(self, keys, timeout: float) -> bool:
        with self.cond:
            self.ops += 1
            present = lambda: all(k in self.data for k in keys)  # noqa: E731
            if self.clock is not None:
                if not present():
                    self.clock.now += timeout
                return present()
            return self.cond.wait_for(present, timeout)

    def wait_get(self, key: str, timeout: float) -> bytes | None:
        return self.data.get(key) if self.wait([key], timeout) else None

    def multi_get(self, keys) -> list[bytes]:
        with self.cond:
            self.ops += 1
            return [self.data.get(k) for k in keys]

    def multi_set(self, keys, values) -> None:
        with self.cond:
            self.ops += 1
            self.data.update(zip(keys, values))
            self.cond.notify_all()

    def clone(self) -> MemoryStore:
        return self

    def close(self) -> None:
        pass


def node(name: str, lo: int = 1, hi: int = 1, nproc: int = 2, restarts: int = 3, token: str | None = None) -> Node:
    return Node(
        node_id=name,
        addr=f"{name}.example",
        nproc=nproc,
        min_nodes=lo,
        max_nodes=hi,
        max_restarts=restarts,
        token=token,
    )


def agent(store: MemoryStore, n: Node, clock=None, port: int = 29500) -> ElasticRendezvous:
    kw = {"clock": clock} if clock else {}
    return ElasticRendezvous(store, "job", n, SETTINGS, port_picker=lambda: port, **kw)


# ---------------------------------------------------------------------------- assign()


def desc(addr: str, nproc: int = 1, prev: int = -1, port: int = 1000) -> dict:
    return {"id": addr, "addr": addr, "port": port, "nproc": nproc, "prev": prev}


def test_assign_a_first_round_in_ticket_order():
    plans = assign([desc("a", 2), desc("b", 3), desc("c", 1)], restarts=0)
    assert [p["group_rank"] for p in plans] == [0, 1, 2]
    assert [p["rank_offset"] for p in plans] == [0, 2, 5]
    assert {p["world_size"] for p in plans} == {6} and {p["group_world_size"] for p in plans} == {3}
    assert {(p["master_addr"], p["master_port"]) for p in plans} == {("a", 1000)}
    assert [p["peer"] for p in plans] == [2, 3, 1]  # the ring, as tickets (1-based)


def test_assign_keeps_previous_group_ranks_and_fills_the_gaps():
    # b was rank 0 and a rank 2 last round; c and d are new; e claims a rank that no longer exists
    plans = assign([desc("a", 1, prev=2), desc("b", 4, prev=0, port=7), desc("c", 2), desc("d", 1, prev=9)], restarts=2)
    assert [p["group_rank"] for p in plans] == [2, 0, 1, 3]
    assert [p["rank_offset"] for p in plans] == [6, 0, 4, 7]  # offsets follow group ranks, not tickets
    assert {p["world_size"] for p in plans} == {8} and {p["restarts"] for p in plans} == {2}
    assert {(p["master_addr"], p["master_port"]) for p in plans} == {("b", 7)}  # group rank 0 hosts the store
    by_rank = sorted(range(4), key=lambda i: plans[i]["group_rank"])
    for rank, i in enumerate(by_rank):
        assert plans[i]["peer"] == by_rank[(rank + 1) % 4] + 1


def test_assign_gives_a_contested_rank_to_the_first_claimant():
    plans = assign([desc("a", prev=1), desc("b", prev=1), desc("c", prev="x")], restarts=0)  # type: ignore[arg-type]
    assert [p["group_rank"] for p in plans] == [1, 0, 2]


def test_assign_one_node_is_its_own_peer():
    (plan,) = assign([desc("solo", 8)], restarts=0)
    assert (plan["group_rank"], plan["world_size"], plan["peer"]) == (0, 8, 1)


# ---------------------------------------------------------------------------- rounds on one node


def test_a_full_round_seals_at_once():
    clock = FakeClock()
    store = MemoryStore(clock)
    rnd = agent(store, node("a", nproc=4), clock).next_round(Cause.START)
    assert (rnd.round, rnd.restart_count, rnd.group_rank, rnd.group_world_size, rnd.world_size) == (0, 0, 0, 1, 4)
    assert (rnd.master_addr, rnd.master_port) == ("a.example", 29500)
    assert store.data["job/r0/sealed"] == b"1:a" and clock.now == 0  # no wait at all
    assert store.ops < 25  # a handful of operations per node


def test_last_call_seals_a_round_below_max():
    clock = FakeClock()
    store = MemoryStore(clock)
    rnd = agent(store, node("a", lo=1, hi=3), clock).next_round(Cause.START)
    assert rnd.group_world_size == 1
    assert SETTINGS.last_call_timeout <= clock.now < SETTINGS.last_call_timeout + 0.5


def test_a_would_be_sealer_looks_at_the_count_once_a_second_until_its_last_call():
    clock = FakeClock()
    store = MemoryStore(clock)
    agent(store, node("a", lo=1, hi=3), clock).next_round(Cause.START)
    looks = SETTINGS.last_call_timeout / LOOK_EVERY
    assert store.ops <= 3 * looks + 16, store.ops  # a wait, a closed check and a count per look (ten a second before)


def test_too_few_nodes_time_out_with_a_clear_error():
    clock = FakeClock()
    store = MemoryStore(clock)
    with pytest.raises(
        RendezvousTimeoutError, match=r"no round formed within 60 s \(join_timeout\); 1 of 2 nodes joined"
    ):
        agent(store, node("a", lo=2, hi=2), clock).next_round(Cause.START)
    assert SETTINGS.join_timeout <= clock.now < SETTINGS.join_timeout + 1.5


def test_failures_are_charged_to_the_budget_until_it_is_spent():
    clock = FakeClock()
    store = MemoryStore(clock)
    a = agent(store, node("a", restarts=2), clock)
    assert a.next_round(Cause.START).restart_count == 0
    assert a.next_round(Cause.MEMBERSHIP).restart_count == 0  # not charged
    second = a.next_round(Cause.FAILURE)
    assert (second.round, second.restart_count) == (2, 1)
    assert a.next_round(Cause.FAILURE).restart_count == 2
    with pytest.raises(RestartBudgetExhausted, match=r"no restarts left \(--max_restarts 2\)"):
        a.next_round(Cause.FAILURE)
    assert store.data["job/closed"] == b"restart budget spent (--max_restarts 2); closed by node a"
    with pytest.raises(RendezvousClosedError, match="the job was closed: restart budget spent"):
        agent(store, node("late"), clock).next_round(Cause.START)


@pytest.mark.parametrize("max_restarts", [0, 1, 3])
def test_every_backend_spends_the_budget_by_the_same_rule(max_restarts):
    """`--max_restarts k`: k failures restart the job and the next one ends it, on a store (the count
    is job-wide) as on one node alone (local, static): one rule, `api.budget_spent`."""
    from launcher.rendezvous.api import JobParams, budget_spent
    from launcher.rendezvous.local import LocalRendezvous
    from launcher.rendezvous.settings import LocalSettings

    clock = FakeClock()
    elastic = agent(MemoryStore(clock), node("a", restarts=max_restarts), clock)
    local = LocalRendezvous(LocalSettings(), JobParams("job", 1, max_restarts=max_restarts), port_picker=lambda: 1)
    for handler in (elastic, local):
        handler.next_round(Cause.START)
        restarts = [handler.next_round(Cause.FAILURE).restart_count for _ in range(max_restarts)]
        assert restarts == list(range(1, max_restarts + 1))
        with pytest.raises(RestartBudgetExhausted, match=rf"no restarts left \(--max_restarts {max_restarts}\)"):
            handler.next_round(Cause.FAILURE)
    assert not budget_spent(max_restarts, max_restarts) and budget_spent(max_restarts + 1, max_restarts)


def test_one_failure_is_charged_once_whoever_reports_it():
    clock = FakeClock()
    store = MemoryStore(clock)
    a = agent(store, node("a"), clock)
    a.next_round(Cause.START)
    store.add("job/r0/failed", 1)  # another node of round 0 reported it first
    assert a.next_round(Cause.FAILURE).restart_count == 0


@pytest.mark.parametrize(
    "theirs, mine, message",
    [
        ("s3cret", None, "needs a join token"),
        ("s3cret", "other", "wrong join token"),
    ],
)
def test_join_tokens_must_match(theirs, mine, message):
    clock = FakeClock()
    store = MemoryStore(clock)
    agent(store, node("a", token=theirs), clock).next_round(Cause.START)
    assert b"s3cret" not in store.data["job/token"]  # an HMAC, never the token
    with pytest.raises(RendezvousError, match=message):
        agent(store, node("b", token=mine), clock).next_round(Cause.START)


def test_a_node_without_the_token_cannot_lock_the_real_nodes_out():
    """A token-less node writes no token check; the first node with the token sets it (over a legacy `none`
    too), and token-less nodes are refused from then on."""
    clock = FakeClock()
    store = MemoryStore(clock)
    stray = agent(store, node("stray"), clock)
    stray.next_round(Cause.START)
    assert "job/token" not in store.data
    stray.shutdown(succeeded=True)  # the stray's one-node job finished
    with pytest.raises(RendezvousClosedError):  # not refused for its token: it learns the job's end
        agent(store, node("real", token="s3cret"), clock).next_round(Cause.START)
    assert store.data["job/token"] == token_check("s3cret", "job")
    with pytest.raises(RendezvousError, match="needs a join token"):
        agent(store, node("stray2"), clock).next_round(Cause.START)
    legacy = MemoryStore(clock)
    legacy.data["job/token"] = b"none"  # written by an older launcher's token-less first node
    assert agent(legacy, node("real", token="s3cret"), clock).next_round(Cause.START).group_rank == 0
    assert legacy.data["job/token"] == token_check("s3cret", "job")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("job/round", b"-1", "malformed round number"),
        ("job/r0/joined", b"-5", "malformed ticket counter"),
        ("job/r0/sealed", b"x:evil", "malformed seal"),
    ],
)
def test_garbage_under_the_prefix_is_a_clear_error(key, value, message):
    clock = FakeClock()
    store = MemoryStore(clock)
    store.data[key] = value
    with pytest.raises(RendezvousError, match=message):
        agent(store, node("a"), clock).next_round(Cause.START)


def test_a_hostile_node_entry_is_left_out():
    """A ticket taken by something that wrote garbage: the sealer leaves it out, the good nodes go on."""
    clock = FakeClock()
    store = MemoryStore(clock)
    store.data["job/r0/joined"] = b"1"
    store.data["job/r0/node1"] = json.dumps({"addr": "a b", "port": 0, "nproc": True, "prev": -1}).encode()
    rnd = agent(store, node("a", lo=1, hi=2), clock).next_round(Cause.START)
    assert (rnd.round, rnd.group_world_size, rnd.world_size) == (0, 1, 2)
    assert "left_out" in json.loads(store.data["job/r0/plan1"])


# ---------------------------------------------------------------------------- several nodes (threads)


def join_all(agents: list[ElasticRendezvous], cause: Cause = Cause.START) -> list:
    results: list = [None] * len(agents)

    def ask(i: int) -> None:
        try:
            results[i] = agents[i].next_round(cause)
        except Exception as e:  # noqa: BLE001 - checked by the caller
            results[i] = e

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a node hung"
    return results


def test_nodes_meet_in_one_round_and_keep_their_ranks_across_a_restart():
    store = MemoryStore()
    nodes = [agent(store, node(f"n{i}", lo=3, hi=3, nproc=i + 1), port=30000 + i) for i in range(3)]
    first = join_all(nodes)
    assert sorted(r.group_rank for r in first) == [0, 1, 2] and {r.world_size for r in first} == {6}
    assert len({(r.master_addr, r.master_port) for r in first}) == 1
    offsets = {r.group_rank: r.rank_offset for r in first}
    sizes = {r.group_rank: n.node.nproc for r, n in zip(first, nodes)}
    assert offsets == {0: 0, 1: sizes[0], 2: sizes[0] + sizes[1]}
    again = join_all(nodes, Cause.FAILURE)
    assert [r.group_rank for r in again] == [r.group_rank for r in first]
    assert {(r.round, r.restart_count) for r in again} == {(1, 1)}
    assert store.data["job/restarts"] == b"1"  # three nodes saw one failure: charged once


def test_group_rank_0_offering_its_kept_port_keeps_the_rounds_address():
    store = MemoryStore()
    nodes = [agent(store, node(f"n{i}", lo=2, hi=2), port=30000 + i) for i in range(2)]
    first = join_all(nodes)
    head = next(n for n, r in zip(nodes, first) if r.group_rank == 0)
    head.offer_port(40123)  # --recovery in-place: its agent keeps serving the workers' store there
    for n in nodes:
        if n is not head:
            n.offer_port(31999)  # not group rank 0: its offer is not the round's address
    kept = join_all(nodes, Cause.FAILURE)
    assert {(r.master_addr, r.master_port) for r in kept} == {(first[0].master_addr, 40123)}
    head.offer_port(0)  # withdrawn: a fresh one again (its picker's)
    assert {r.master_port for r in join_all(nodes, Cause.MEMBERSHIP)} == {first[0].master_port}


def test_a_node_joins_a_round_in_five_store_calls_whatever_the_size():
    """One read (round, closed, token), the ticket, the alive key, the descriptor, the plan; the
    sealer's few calls and the first node's compare_sets are the only others."""
    for n in (8, 32):
        store = MemoryStore()
        join_all([agent(store, node(f"n{i}", lo=n, hi=n)) for i in range(n)])
        assert store.ops <= 5 * n + 12, (n, store.ops)


def test_a_node_below_min_whose_round_was_sealed_but_never_planned_gives_up_after_two_read_timeouts():
    clock = FakeClock()
    store = MemoryStore(clock)
    store.data["job/r0/sealed"] = b"3:the-sealer"  # sealed for tickets 1..3, and then the sealer died
    with pytest.raises(RendezvousTimeoutError, match="round 0 was sealed but its plan never came"):
        agent(store, node("a", lo=3, hi=3), clock).next_round(Cause.START)
    assert 2 * SETTINGS.read_timeout <= clock.now <= 2 * SETTINGS.read_timeout + 2 * WAIT_REPORT_EVERY


def test_a_node_below_min_learns_that_the_job_closed_while_it_waited():
    clock = FakeClock()
    store = MemoryStore(clock)
    a = agent(store, node("a", lo=2, hi=2), clock)
    real_wait_get = store.wait_get

    def closing(key, timeout):  # the job closes during the first wait
        store.data.setdefault("job/closed", b"it finished; closed by node b")
        return real_wait_get(key, timeout)

    store.wait_get = closing
    with pytest.raises(RendezvousClosedError, match="it finished"):
        a.next_round(Cause.START)
    assert clock.now <= WAIT_REPORT_EVERY


def test_the_watch_posts_a_membership_change_when_the_round_ends():
    store = MemoryStore()
    a = agent(store, node("a"))
    rnd = a.next_round(Cause.START)
    posted: list = []
    got = threading.Event()
    a.watch(rnd, lambda event: (posted.append(event), got.set()))
    store.compare_set("job/r0/change", b"", b"b wants to join")
    assert got.wait(10)
    assert isinstance(posted[0], MembershipChanged) and posted[0].reason == "b wants to join"
    a.shutdown(succeeded=True)
    assert store.data["job/r0/done0"] == b"1" and store.data["job/r0/finished"] == b"1"


def test_leaving_tells_the_others():
    store = MemoryStore()
    a = agent(store, node("a"))
    a.next_round(Cause.START)
    a.shutdown(succeeded=False, why="stopped by SIGTERM")
    assert store.data["job/r0/left"] == b"1" and store.data["job/r0/change"] == b"a left: stopped by SIGTERM"


# ---------------------------------------------------------------------------- the job's verdict


VERDICT = Verdict(
    host="h1",
    node="",
    rank=3,
    local_rank=1,
    returncode=1,
    round=0,
    error="RuntimeError: loss is NaN",
    log="/logs/attempt_0/1/stderr.log",
)


def test_the_node_that_spends_the_budget_publishes_the_verdict_and_every_node_reads_it():
    store = MemoryStore()
    host = ElasticRendezvous(
        store, "job", node("n0", lo=2, hi=2, restarts=0), SETTINGS, port_picker=lambda: 1, is_host=True
    )
    other = agent(store, node("n1", lo=2, hi=2, restarts=0))
    join_all([host, other])
    with pytest.raises(RestartBudgetExhausted):
        host.next_round(Cause.FAILURE, VERDICT)
    assert store.data["job/r0/change"] == b"restart budget spent (--max_restarts 0); closed by node n0"
    with pytest.raises(RendezvousClosedError, match="closed by node n0") as closed:
        other.next_round(Cause.MEMBERSHIP)
    assert closed.value.verdict == replace(VERDICT, node="n0")  # the closer names itself
    assert store.data["job/acks"] == b"2"  # the closer and the reader
    done = threading.Thread(target=host.shutdown, args=(False,), daemon=True)
    done.start()
    done.join(5)  # both acknowledged: the host's store may go at once
    assert not done.is_alive()


def test_the_store_host_waits_for_the_readers_at_most_the_exit_barrier_timeout():
    store = MemoryStore()
    host = ElasticRendezvous(
        store, "job", node("n0", lo=2, hi=2, restarts=0), SETTINGS, port_picker=lambda: 1, is_host=True
    )
    join_all([host, agent(store, node("n1", lo=2, hi=2, restarts=0))])
    store.clock = host.clock = FakeClock()  # from here on, waits move simulated time
    with pytest.raises(RestartBudgetExhausted):
        host.next_round(Cause.FAILURE, VERDICT)
    host.shutdown(succeeded=False)  # n1 never reads it
    assert SETTINGS.exit_barrier_timeout <= host.clock.now < SETTINGS.exit_barrier_timeout + 1


def test_a_verdict_is_cut_to_its_limits_and_made_printable():
    assert decode_verdict(encode_verdict(VERDICT)) == VERDICT
    long = replace(VERDICT, host="evil\nhost", error="E" * 10_000 + "\x1b[31m", log="/x" * 2000)
    raw = encode_verdict(long)
    back = decode_verdict(raw)
    assert len(raw) <= MAX_VERDICT and back.host == "evil host" and back.error == "E" * 300 and len(back.log) == 1024


def _verdict_with(**fields) -> bytes:
    return json.dumps({**json.loads(encode_verdict(VERDICT)), **fields}).encode()


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"{" + b" " * MAX_VERDICT + b"}", "oversized verdict"),
        (b"not json", "verdict that is not JSON"),
        (b"[1, 2]", "malformed verdict"),
        (_verdict_with(rank=True), "malformed verdict"),
        (_verdict_with(rank=-1), "malformed verdict"),
        (_verdict_with(returncode="1"), "malformed verdict"),
        (_verdict_with(error="line one\nline two"), "malformed verdict"),
        (_verdict_with(error="x" * 301), "malformed verdict"),
        (_verdict_with(host=None), "malformed verdict"),
    ],
)
def test_hostile_verdicts_are_rejected_and_the_close_still_says_why(raw, message):
    with pytest.raises(RendezvousError, match=message):
        decode_verdict(raw)
    clock = FakeClock()
    store = MemoryStore(clock)
    store.data.update({"job/verdict": raw, "job/closed": b"restart budget spent; closed by node x"})
    with pytest.raises(RendezvousClosedError, match="restart budget spent; closed by node x") as closed:
        agent(store, node("late"), clock).next_round(Cause.START)
    assert closed.value.verdict is None


# ---------------------------------------------------------------------------- what a forming round waits for


def test_a_forming_round_says_every_few_seconds_how_many_joined_and_how_long_is_left(caplog):
    clock = FakeClock()
    store = MemoryStore(clock)
    told: list[str] = []
    with caplog.at_level("INFO", logger="launcher.rendezvous.protocol"), pytest.raises(RendezvousTimeoutError):
        agent(store, node("a", lo=2, hi=3), clock).next_round(Cause.START, waiting=told.append)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for nodes")]
    assert len(lines) == pytest.approx(SETTINGS.join_timeout / WAIT_REPORT_EVERY, abs=1)
    assert [w.line for w in told] == lines  # the same line for the live view
    assert {w.kind for w in told} == {WaitKind.NODES}
    assert lines[0] == "waiting for nodes in round 0: 1 joined (min 2, max 3); join timeout in 55 s"


def test_a_node_missing_from_the_last_round_is_named_while_waiting(caplog):
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2)) for name in ("a", "b"))
    join_all([a, b])
    store.clock = a.clock = FakeClock()  # b never comes back: a waits alone, in simulated time
    with caplog.at_level("INFO", logger="launcher.rendezvous.protocol"), pytest.raises(RendezvousTimeoutError):
        a.next_round(Cause.MEMBERSHIP)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for nodes")]
    assert lines[0] == (
        "waiting for nodes in round 1: 1 joined (min 2, max 2), 2 expected back from round 0; "
        "missing: b; join timeout in 55 s"
    )


def test_the_others_are_told_which_rank_failed_when_a_failure_ends_the_round():
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2)) for name in ("a", "b"))
    rounds = join_all([a, b])
    posted: list = []
    got = threading.Event()
    b.watch(rounds[1], lambda event: (posted.append(event), got.set()))
    result: list = []
    threading.Thread(target=lambda: result.append(a.next_round(Cause.FAILURE, VERDICT)), daemon=True).start()
    assert got.wait(10)
    assert (
        posted[0].reason
        == "rank 3 (local rank 1) on h1 exited with code 1 (attempt 0): RuntimeError: loss is NaN, node a"
    )
    assert posted[0].failed and not posted[0].closed
    b._stop_watch.set()
    b.next_round(Cause.MEMBERSHIP)  # both meet again, restart charged once


def test_a_finished_job_is_closed_so_a_node_that_comes_back_late_stops():
    """The last node to finish closes the job: a node frozen through the end (or a spare) that
    wakes and asks for a round learns the job ended, instead of waiting for the join timeout."""
    store = MemoryStore()
    nodes = [agent(store, node(f"n{i}", lo=2, hi=2), port=30000 + i) for i in range(2)]
    rounds = join_all(nodes)
    nodes[0].shutdown(succeeded=True)
    assert "job/closed" not in store.data  # one of two finished: the job goes on
    nodes[1].shutdown(succeeded=True)
    assert (
        store.data["job/closed"]
        == f"it finished (round {rounds[0].round} ended on all 2 nodes); closed by node n1".encode()
    )
    late = agent(store, node("late", lo=2, hi=2))
    with pytest.raises(RendezvousClosedError, match="the job was closed: it finished"):
        late.next_round(Cause.START)


def test_a_round_whose_record_is_gone_still_gets_a_reason():
    """A node frozen while the others finished and cleared the job's keys wakes to a change whose
    reason is gone: it says so instead of an empty reason."""
    store = MemoryStore()
    a = agent(store, node("a"))
    a.next_round(Cause.START)
    assert a._why_changed(store, 0) == "round 0 ended while this node was away; the other nodes have left it"
    store.compare_set("job/r0/change", b"", b"b left")
    assert a._why_changed(store, 0) == "b left"
