"""scripts/chaos/'s invariants as pure functions: hand-made episode records, one that breaks each invariant
and one that keeps it; and the fault schedule a seed plans, pinned (the suite's seeds replay the same faults)."""

from __future__ import annotations

import sys

import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # the campaign's package, scripts/chaos/
from chaos import invariants as inv  # noqa: E402
from chaos.faults import IN_PLACE_STRIKES, STRIKES, plan  # noqa: E402
from chaos.records import FOR_GOOD, LIVENESS, REFORM_S, STOP_S, AgentRecord, Episode, Fault, Shape  # noqa: E402

pytestmark = pytest.mark.timeout(30)


def start(rank: int, world: int = 4, restart: int = 0, rnd: int = 1, frm: int = 0) -> str:
    return f"[rank{rank}]: start rank={rank} world={world} restart={restart} round={rnd} from={frm}"


def step(rank: int, n: int) -> str:
    return f"[rank{rank}]: step rank={rank} n={n}"


def agent(name: str, rc: int | None = 0, out=(), err=(), **kw) -> AgentRecord:
    """A record whose `out` and `err` are lines, or (time, line) pairs; a bare line arrives at 1.0 s."""
    pairs = [[(1.0, x) if isinstance(x, str) else x for x in lines] for lines in (out, err)]
    (out_at, out_lines), (err_at, err_lines) = (tuple(zip(*p)) if p else ((), ()) for p in pairs)
    return AgentRecord(name, rc, out=out_lines, out_at=out_at, err=err_lines, err_at=err_at, **kw)


def ran(name: str, ranks: tuple[int, int], rc: int | None = 0, **kw) -> AgentRecord:
    """A node whose two workers started in round 1 and stepped twice."""
    out = [start(r) for r in ranks] + [step(r, n) for n in (1, 2) for r in ranks]
    return agent(name, rc, out=out, **kw)


def episode(*landed: Fault, shape: Shape = Shape.ELASTIC, **kw) -> Episode:
    return Episode("c10d", 1, shape, landed=list(landed), **kw)


def test_a_clean_episode_keeps_every_invariant():
    ep = episode()
    agents = [ran("node0", (0, 1)), ran("node1", (2, 3))]
    assert inv.check(ep, agents, '{"step": 2}') == []


def test_each_node_ends_clearly_within_the_bound():
    assert inv.ended_clearly([agent("a", 0), agent("b", 1, err=["reason: a worker failed"])], {}) == []
    found = inv.ended_clearly(
        [agent("a", None), agent("b", 0, err=["Traceback (most recent call last):"]), agent("c", 1)], {}
    )
    assert found == [
        "a still running after the bound",
        "b: a Python traceback on the agent's stderr",
        "c: exit 1 with no reason given",
    ]
    # a worker's traceback (in place: a newcomer whose source was killed mid-transfer) is the script's
    assert inv.ended_clearly([agent("a", 0, err=["[rank2]: Traceback (most recent call last):"])], {}) == []
    assert inv.ended_clearly([agent("a", 0, err=["[vm rank2]: Traceback (most recent call last):"])], {}) == []


def test_a_cut_node_that_gives_up_names_what_it_lost():
    cut = inv.cut_reasons(episode(cuts=[("a", 5.0, FOR_GOOD)]))
    named = agent("a", 1, err=["launcher: reason: lost the rendezvous store at 10.117.0.1:1"])
    assert inv.ended_clearly([named], cut) == []
    quarantined = agent("a", 69, err=["launcher: reason: a is quarantined: its workers failed"])
    assert inv.ended_clearly([quarantined], cut) == []
    vague = agent("a", 1, err=["launcher: reason: the job was closed"])  # only a temporary cut may find that
    assert inv.ended_clearly([vague], cut) != []
    assert inv.ended_clearly([vague], inv.cut_reasons(episode(cuts=[("a", 5.0, 3.0)]))) == []


def test_an_ended_agent_leaves_no_process():
    assert inv.no_orphans([agent("a", 0), agent("b", None, left=(7,))]) == []
    assert inv.no_orphans([agent("a", -9, left=(7, 8))]) == ["a: processes left after its agent ended: [7, 8]"]


def test_the_nodes_of_a_round_agree_and_no_rank_runs_twice():
    assert inv.rounds_agree(inv.rounds([ran("a", (0, 1)), ran("b", (2, 3))])) == []
    disagree = inv.rounds([agent("a", out=[start(0, world=4)]), agent("b", out=[start(1, world=2)])])
    assert inv.rounds_agree(disagree) == ["round 1: nodes disagree: [('a', '4', '0'), ('b', '2', '0')]"]
    twice = inv.rounds([agent("a", out=[start(0)]), agent("b", out=[start(0)])])
    assert inv.rounds_agree(twice) == ["round 1: a rank ran twice: ['0', '0']"]


def test_only_a_failed_worker_is_charged_to_the_elastic_budget():
    restarted = inv.rounds([agent("a", out=[start(0), start(0, restart=1, rnd=2)])])
    assert inv.budget(episode(Fault.WORKER_KILL), restarted) == []
    assert inv.budget(episode(Fault.AGENT_KILL), restarted) == ["1 restart(s) charged, but 0 worker(s) killed"]


def test_a_lost_member_is_charged_once_to_the_fixed_size_budget():
    twice = inv.rounds([agent("a", out=[start(0), start(0, restart=2, rnd=3)])])
    assert inv.spares_budget(episode(Fault.WORKER_KILL, Fault.AGENT_KILL, shape=Shape.SPARES), twice) == []
    assert inv.spares_budget(episode(Fault.AGENT_KILL, shape=Shape.SPARES), twice) == [
        "2 restart(s) charged, but 0 worker(s) killed and 1 node(s) stopped"
    ]


def spare_episode(**kw) -> Episode:
    return episode(Fault.AGENT_KILL, shape=Shape.SPARES, victims=["node0"], **kw)


def test_the_spare_replaces_a_lost_member():
    taken = [
        agent("node0", -9, killed=True, out=[start(0)]),
        agent("node1", 0, out=[start(1), start(1, restart=1, rnd=2)]),
        agent("node2", 0, out=[(5.0, start(0, restart=1, rnd=2))]),
    ]
    assert inv.spares(spare_episode(), taken, inv.rounds(taken)) == []
    stood_by = [*taken[:2], agent("node2", 0)]
    assert inv.spares(spare_episode(), stood_by, inv.rounds(stood_by)) == [
        "node0 was lost and the spare stood by, but the spare never ran workers"
    ]


def test_a_fixed_size_job_keeps_its_world_and_one_verdict():
    agents = [agent("node0", 0, out=[start(0, world=2)]), agent("node1", 1, err=["reason: x"]), agent("node2", 0)]
    assert inv.spares(episode(shape=Shape.SPARES), agents, inv.rounds(agents)) == [
        "a fixed-size job of 2 x 2 workers ran at world size ['2']",
        "the nodes left untouched end with different verdicts: {'node0': 0, 'node1': 1, 'node2': 0}",
    ]


def test_a_quarantined_node_exits_69_and_runs_no_worker_again():
    said = (2.0, "launcher: node0 is quarantined: its workers failed")
    spare = agent("node2", 0, out=[(3.0, start(0, restart=1, rnd=2))])  # in node0's place
    kept = [agent("node0", 69, out=[(1.0, start(0))], err=[said]), agent("node1", 0), spare]
    ep = episode(Fault.WORKER_KILL, shape=Shape.SPARES, victims=["node0"])
    assert inv.spares(ep, kept, inv.rounds(kept)) == []
    broke = [agent("node0", 0, out=[(1.0, start(0)), (3.0, start(0, rnd=2))], err=[said]), *kept[1:]]
    found = inv.spares(ep, broke, inv.rounds(broke))
    assert found[0] == "node0 was quarantined but exited 0, not 69"
    assert found[1].startswith("node0 was quarantined but ran workers again: Start(agent='node0'")


def test_a_fault_that_is_ridden_out_changes_nothing():
    one = [ran("a", (0, 1)), ran("b", (2, 3))]
    assert inv.ridden_out(episode(Fault.DISK_FULL, done=["log disk filled"]), one, inv.rounds(one)) == []
    two = [agent("a", 0, out=[start(0), start(0, rnd=2)]), agent("b", 0)]
    assert inv.ridden_out(episode(Fault.DISK_FULL, done=["log disk filled"]), two, inv.rounds(two)) == [
        "log disk filled: not ridden out: rounds ['1', '2'], exits {'a': 0, 'b': 0}"
    ]
    assert inv.ridden_out(episode(Fault.DISK_FULL, Fault.WORKER_KILL), two, inv.rounds(two)) == []


def test_each_survivor_names_a_cause_that_was_injected():
    ep = episode(Fault.AGENT_KILL, done=["SIGKILL agent b"], expect=[("the killed agent", r"died|lost its lease")])
    good = agent("a", 0, err=["launcher: membership changed: b died"])
    assert inv.causes_named(ep, [good], {}) == [] and inv.fault_named(ep, [good], {}) == []
    wrong = agent("a", 0, err=["launcher: restarting: a worker exited with 1"])
    assert inv.causes_named(ep, [wrong], {}) == [
        "a named a cause that was not injected: 'launcher: restarting: a worker exited with 1' "
        "(injected: SIGKILL agent b)"
    ]
    assert inv.fault_named(ep, [wrong], {}) == [
        "no survivor named the killed agent; they said: ['launcher: restarting: a worker exited with 1']"
    ]
    ep.frozen.add("a")  # a frozen node speaks of what it missed
    assert inv.causes_named(ep, [wrong], {}) == [] and inv.fault_named(ep, [wrong], {}) == []


def test_a_node_cut_off_for_good_stops_its_workers():
    ep = episode(Fault.LINK_DOWN, cuts=[("a", 10.0, FOR_GOOD)])
    assert inv.cut_nodes(ep, [agent("a", 1, out=[(10.0 + STOP_S, step(0, 5))])]) == []
    assert inv.cut_nodes(ep, [agent("a", 1, out=[(10.0 + STOP_S + 1, step(0, 5))])]) == [
        f"a: cut off for good, its workers still ran {STOP_S + 1:.0f} s after the cut (at most {STOP_S:g} s)"
    ]


def test_the_others_re_form_without_a_node_cut_past_the_liveness_timeout():
    ep = episode(Fault.LINK_CUT, cuts=[("a", 10.0, LIVENESS + 3.0)])
    cut = agent("a", 0, out=[(5.0, start(0))])
    by = 10.0 + LIVENESS + REFORM_S
    reformed = agent("b", 0, out=[(5.0, start(1)), (by - 1, start(0, restart=0, rnd=2))])
    assert inv.cut_nodes(ep, [cut, reformed]) == []
    finished = agent("b", 0, out=[(5.0, start(1))], ended_at=by - 1)
    assert inv.cut_nodes(ep, [cut, finished]) == []
    stuck = agent("b", 1, out=[(5.0, start(1)), (by + 1, start(0, rnd=2))])
    assert inv.cut_nodes(ep, [cut, stuck]) == [
        f"b: neither re-formed without a nor finished within {LIVENESS:g} + {REFORM_S:g} s "
        f"of its link's cut ({LIVENESS + 3.0:.1f} s)"
    ]
    assert inv.cut_nodes(episode(Fault.LINK_CUT, cuts=[("a", 10.0, 1.0)]), [cut, stuck]) == []  # a short cut


def test_the_checkpoint_is_whole():
    assert inv.checkpoint_whole(None) == [] and inv.checkpoint_whole('{"step": 3}') == []
    assert inv.checkpoint_whole('{"step": ')[0].startswith("checkpoint not whole: ")


def test_no_step_line_is_lost_on_a_node_that_finished():
    assert inv.no_line_lost([ran("a", (0, 1))]) == []
    gap = [start(0, frm=4), step(0, 5), step(0, 7)]
    assert inv.no_line_lost([agent("a", 0, out=gap)]) == ["a: rank 0 printed step 7 after step 5: a line was lost"]
    assert inv.no_line_lost([agent("a", 1, out=gap)]) == []  # a node that gave up may lose its last lines


def test_check_reports_in_order_and_skips_a_killed_agent():
    ep = episode(Fault.AGENT_KILL, victims=["b"], done=["SIGKILL agent b"])
    agents = [agent("a", None), agent("b", -9, killed=True, left=(9,))]
    assert inv.check(ep, agents, "{") == [
        "a still running after the bound",
        "b: processes left after its agent ended: [9]",
        "checkpoint not whole: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ]


def test_every_fault_kind_strikes():
    assert set(STRIKES) | set(IN_PLACE_STRIKES) == set(Fault)


@pytest.mark.parametrize(
    "backend,seed,skip,faults",
    [
        ("c10d", 164, set(), [(0.452, Fault.LINK_CUT)]),
        ("c10d", 7111, set(), [(0.207, Fault.AGENT_KILL), (0.738, Fault.LINK_DOWN)]),
        ("etcd", 169, set(), [(0.937, Fault.LEADER_KILL)]),
        ("etcd", 7111, set(), [(0.292, Fault.AGENT_KILL), (0.441, Fault.MEMBER_KILL)]),
        ("c10d", 164, {Fault.DISK_FULL, Fault.LINK_CUT}, [(1.491, Fault.NODE_FREEZE)]),
    ],
)
def test_a_seed_plans_the_same_faults(backend, seed, skip, faults):
    assert plan(backend, seed, skip, Shape.SPARES).faults == plan(backend, seed, skip).faults == faults
