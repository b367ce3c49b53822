"""goodput.Ledger with an injected clock: the components of scripted jobs, to the millisecond."""

import pytest

from launcher.telemetry.goodput import Breakdown, Component, Ledger, total


def approx(x):
    return pytest.approx(x, abs=1e-6)


def steps(ledger, now, step, ranks=(0, 1)):
    ledger.steps(now, {r: (step, now) for r in ranks})


def test_a_job_that_fails_once_and_redoes_its_steps():
    g = Ledger(0.0)
    g.rendezvous(0.0)
    g.running(2.0, {0, 1}, 0)  # 2 s forming the round
    for i in range(1, 21):  # step i at 3 + i (1 step/s) ... the first at 4.0: 2 s of start-up
        steps(g, 3.0 + i, i)
    g.failure(23.5)  # reached step 20; the checkpoint was at step 15
    g.rendezvous(24.0)
    g.running(25.0, {0, 1}, 1)
    for i in range(16, 31):  # resumed from 15: the first step at 27.0
        steps(g, 11.0 + i, i)
    g.done(41.0)
    g.finish(41.5)
    b = g.breakdown(99.0)
    assert b.wall == approx(41.5)
    assert b.rendezvous == approx(2.0 + 0.5)  # forming, then waiting at the end
    assert b.startup == approx(2.0)
    assert b.restart == approx(27.0 - 23.5)
    assert (b.redone_steps, b.restarts) == (5, 1)
    assert b.redone == approx(5.0)  # 5 steps at 1 step/s
    assert b.training == approx((23.5 - 4.0) + (41.0 - 27.0) - 5.0)
    assert sum(b.seconds(c) for c in Component) == approx(b.wall)


def test_a_failure_on_another_node_is_a_restart_once_the_count_rises():
    g = Ledger(0.0)
    g.running(0.0, {0}, 0)
    steps(g, 1.0, 1, (0,))
    g.membership(5.0)  # stopped: another node's worker failed
    g.rendezvous(5.0, membership=True)
    g.running(7.0, {0}, 1)  # the restart count rose: it was a restart
    steps(g, 8.0, 2, (0,))
    b = g.breakdown(10.0)
    assert (b.restart, b.rendezvous, b.restarts) == (approx(3.0), approx(0.0), 1)


def test_a_membership_change_is_rendezvous_time():
    g = Ledger(0.0)
    g.running(0.0, {0}, 0)
    steps(g, 1.0, 1, (0,))
    g.membership(5.0)
    g.rendezvous(5.0, membership=True)
    g.running(7.0, {0}, 0)
    steps(g, 8.0, 2, (0,))
    b = g.breakdown(10.0)
    assert (b.rendezvous, b.restart, b.restarts, b.training) == (approx(3.0), 0.0, 0, approx(6.0))


def test_a_hang_moves_its_silence_from_training_to_stalls():
    g = Ledger(0.0)
    g.running(0.0, {0}, 0)
    steps(g, 1.0, 1, (0,))
    g.hang(21.0, idle=15.0)
    g.failure(21.5)
    b = g.breakdown(22.0)
    assert (b.stall, b.training, b.restart, b.restarts) == (approx(15.0), approx(5.0), approx(1.0), 1)


def test_without_steps_a_running_round_is_training():
    g = Ledger(0.0)
    g.running(1.0, {0}, 0)
    g.done(9.0)
    g.finish(9.5)
    b = g.breakdown(9.5)
    assert (b.training, b.rendezvous, b.startup, b.steps_known) == (approx(8.0), approx(1.5), 0.0, False)
    assert "unknown" in b.line()


def test_stragglers_are_counted_apart():
    g = Ledger(0.0)
    g.straggling(10.0, rate=1.0, median=4.0)
    assert g.breakdown(1.0).straggler_steps == approx(30.0)


def test_the_job_figure_is_machine_time():
    a = Breakdown(wall=10.0, training=9.0, restart=1.0)
    b = Breakdown(wall=30.0, training=15.0, restart=15.0)
    job = total([a, b])
    assert job.nodes == 2 and job.wall == approx(20.0) and job.goodput == approx(24.0 / 40.0)
    assert Breakdown.from_dict(job.to_dict()) == job.rounded()
    assert Breakdown.from_dict({"wall": "x"}) is None and Breakdown.from_dict({"wall": float("nan")}) is None


def test_the_line():
    b = Breakdown(wall=3 * 3600 + 12 * 60, training=11000.0, restart=520.0, redone=0.0, restarts=2, steps_known=True)
    assert b.line().startswith("goodput 95.5 % of 3 h 12 m: restarts 8 m 40 s (2)")
