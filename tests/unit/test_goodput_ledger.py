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
    assert (b.stall, b.training, b.restart, b.restarts) == (approx(15.0), approx(5.0), approx(1.0), 0)
    g.running(23.0, {0}, 1)  # the restart is counted once its round runs, as the verdict line counts it
    assert g.breakdown(23.0).restarts == 1


def test_without_steps_a_running_round_is_training():
    g = Ledger(0.0)
    g.running(1.0, {0}, 0)
    g.done(9.0)
    g.finish(9.5)
    b = g.breakdown(9.5)
    assert (b.training, b.rendezvous, b.startup, b.steps_known) == (approx(8.0), approx(1.5), 0.0, False)
    assert "training estimated" in b.line() and "no launcher.progress(step=)" in b.line()


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


def summed(b: Breakdown) -> float:
    return sum(b.seconds(c) for c in Component)


def test_the_preload_import_is_start_up_and_a_restart_without_steps_ends_when_its_workers_run():
    """The demo's timeline (scripts/demo.sh: --preload, no progress(), rank 1 killed in round 0)."""
    g = Ledger(0.0)
    g.rendezvous(0.0)
    g.formed(0.01)  # standalone: the round forms at once
    g.running(2.2, {0, 1}, 0)  # the preloaded interpreter's imports: 2.19 s
    g.failure(2.55)  # rank 1 killed
    g.rendezvous(2.56)
    g.formed(2.56)
    g.running(2.60, {0, 1}, 1)  # forked again: training again 0.05 s after the kill
    g.done(3.85)
    g.finish(3.87)
    b = g.breakdown(3.87)
    assert b.rendezvous == approx(0.01 + 0.02) and b.startup == approx(2.19)
    assert b.restart == approx(0.05) and b.restarts == 1 and b.shutdown == 0.0
    assert b.training == approx((2.55 - 2.2) + (3.85 - 2.6)) and summed(b) == approx(b.wall)
    line = b.line()
    assert line.startswith(
        "goodput 41.3 % of 3.9 s: start-up 2.2 s, restarts 50 ms (1), rendezvous and waiting 30 ms;"
    ), line
    assert "measured to the workers' start; training estimated" in line and "unknown" not in line


def test_with_steps_the_workers_own_start_up_and_restart_are_booked_once_a_step_shows():
    g = Ledger(0.0)
    g.rendezvous(0.0)
    g.formed(1.0)
    g.running(3.0, {0}, 0)  # 2 s of the preloaded interpreter's imports
    steps(g, 4.0, 1, (0,))  # and 1 s of the worker's own start: start-up 3 s
    steps(g, 10.0, 7, (0,))
    g.failure(10.5)
    g.rendezvous(10.5)
    g.formed(10.6)
    g.running(10.7, {0}, 1)
    steps(g, 11.5, 6, (0,))  # resumed from 5: step 6 first, 0.8 s after the workers' start
    g.done(15.0)
    g.finish(15.0)
    b = g.breakdown(15.0)
    assert (b.rendezvous, b.startup, b.restart) == (approx(1.0), approx(3.0), approx(1.0))
    assert (b.restarts, b.redone_steps, b.redone) == (1, 2, approx(2.0))  # steps 6 and 7, at 1 step/s
    assert summed(b) == approx(b.wall) and b.line().count("re-done steps 2.0 s (2 steps)") == 1


def test_a_signal_is_the_shutdown_not_rendezvous():
    g = Ledger(0.0)
    g.rendezvous(0.0)
    g.formed(0.5)
    g.running(1.0, {0}, 0)
    steps(g, 2.0, 1, (0,))
    g.shutdown(8.0)  # Ctrl-C
    g.membership(8.0)  # the stop that follows (a no-op: the workers are stopping already)
    g.finish(9.5)
    b = g.breakdown(9.5)
    assert (b.shutdown, b.rendezvous, b.restart, b.training) == (approx(1.5), approx(0.5), 0.0, approx(6.0))
    assert b.restarts == 0 and summed(b) == approx(b.wall) and "shutdown 1.5 s" in b.line()


def test_a_failure_that_ends_the_job_is_its_shutdown_and_no_restart():
    """--max_restarts 0: the verdict says 0 restarts, and so does the line."""
    g = Ledger(0.0)
    g.rendezvous(0.0)
    g.formed(0.0)
    g.running(1.0, {0, 1}, 0)
    steps(g, 2.0, 1)
    g.failure(5.0)
    g.rendezvous(5.2)  # the rendezvous closes the job: no round follows
    g.finish(5.5)
    b = g.breakdown(5.5)
    assert (b.restarts, b.restart, b.shutdown) == (0, 0.0, approx(0.5)) and summed(b) == approx(b.wall)
    assert "restarts" not in b.line()


def test_a_second_failure_without_steps_opens_a_second_restart():
    g = Ledger(0.0)
    g.running(0.0, {0}, 0)
    for k, at in enumerate((2.0, 4.0)):
        g.failure(at)
        g.rendezvous(at)
        g.formed(at + 0.1)
        g.running(at + 0.3, {0}, k + 1)
    g.done(6.0)
    g.finish(6.0)
    b = g.breakdown(6.0)
    assert (b.restarts, b.restart, b.training) == (2, approx(0.6), approx(5.4)) and summed(b) == approx(b.wall)


def test_one_redone_step_is_one_step():
    assert "(1 step)" in Breakdown(wall=2.0, training=1.0, redone=1.0, redone_steps=1, steps_known=True).line()


def test_a_rank_with_nothing_left_to_do_is_not_awaited():
    """Rank 0 had finished its steps before rank 1 failed: resumed, it exits 0 without a step."""
    g = Ledger(0.0)
    g.running(0.0, {0, 1}, 0)
    steps(g, 1.0, 1)
    g.failure(5.0)
    g.rendezvous(5.0)
    g.formed(5.0)
    g.running(5.5, {0, 1}, 1)
    g.finished_rank(5.7, 0)  # no step this round: nothing left for it to do
    steps(g, 6.0, 3, (1,))  # rank 1's first step closes the restart
    g.done(9.0)
    g.finish(9.0)
    b = g.breakdown(9.0)
    assert (b.restart, b.restarts, b.training) == (approx(1.0), 1, approx(4.0 + 3.0)) and summed(b) == approx(b.wall)


def test_a_spare_standing_by_is_apart_and_its_joining_is_the_jobs_recovery():
    """The load harness' timeline (issue 32): two members train 658 s without steps; a spare stands by
    from its start (2 s after them) until a member is lost at 594 s; it joins (a restart: the loss was
    charged) and trains to the end. Its standby is not the job's time."""
    member, spare = Ledger(0.0), Ledger(2.0)
    member.rendezvous(0.0)
    member.formed(0.5)
    member.running(0.6, {0, 1}, 0)
    spare.rendezvous(2.0)
    spare.spare(2.01)  # told the job is full
    member.membership(594.0)  # the other member lost its lease
    member.rendezvous(594.0, membership=True)
    member.running(594.4, {0, 1}, 1)
    assert spare.breakdown(300.0) == Breakdown(standby=approx(298.0))  # standing by: no wall yet
    spare.formed(594.5)  # called: it forms the new round with the member
    spare.running(595.0, {2, 3}, 1)
    for g in (member, spare):
        g.done(658.0)
        g.finish(658.2)
    m, s = member.breakdown(700.0), spare.breakdown(700.0)
    assert (m.wall, m.standby, m.restart, m.restarts) == (approx(658.2), 0.0, approx(0.4), 1)
    assert (s.wall, s.standby) == (approx(658.2 - 594.5), approx(594.5 - 2.0))
    assert (s.restart, s.training, s.rendezvous, s.startup) == (approx(0.5), approx(63.0), approx(0.2), 0.0)
    assert sum(s.seconds(c) for c in Component) == approx(s.wall)
    job = total([m, s])
    assert job.goodput == approx((m.training + s.training) / (m.wall + s.wall))
    assert job.goodput > 0.99 and job.standby == approx(592.5)
    assert job.line().startswith(  # was 54.8 % of 10 m 58 s: rendezvous and waiting 4 m 57 s (the standby)
        "goodput 99.7 % of 6 m 0 s: rendezvous and waiting 0.5 s, restarts 0.4 s (1); "
        "spare standing by 9 m 52 s apart (capacity in reserve, not the job's time); lost time measured"
    ), job.line()


def test_a_spare_the_job_finished_without_ran_no_round_and_stood_by_all_along():
    g = Ledger(10.0)
    g.rendezvous(10.0)
    g.spare(10.1)
    g.finish(70.0)
    b = g.breakdown(99.0)
    assert (b.wall, b.standby, b.training) == (0.0, approx(60.0), 0.0)


def test_a_spare_stopped_by_a_signal_stood_by_until_then():
    g = Ledger(0.0)
    g.spare(0.1)
    g.shutdown(30.0)
    g.finish(30.5)
    b = g.breakdown(99.0)
    assert (b.wall, b.standby, b.shutdown) == (approx(0.5), approx(30.0), approx(0.5))


def test_a_member_that_waits_as_a_spare_after_a_round_stands_by_from_then():
    g = Ledger(0.0)
    g.running(1.0, {0}, 0)
    g.membership(11.0)
    g.rendezvous(11.0, membership=True)
    g.spare(12.0)  # the re-formed round is full without it
    g.called(40.0)  # its wait turned into a round forming: the job's again
    g.formed(41.0)
    g.running(41.5, {0}, 0)
    g.finish(50.0)
    b = g.breakdown(99.0)
    assert (b.standby, b.wall) == (approx(28.0), approx(22.0))
    assert b.rendezvous == approx(1.0 + 1.0 + 1.5)  # forming round 0, 11 to 12, and 40 to 41.5
    assert sum(b.seconds(c) for c in Component) == approx(b.wall)


def test_the_standby_goes_through_a_dict():
    b = Breakdown(wall=3.0, training=3.0, standby=12.3456)
    assert Breakdown.from_dict(b.to_dict()) == b.rounded() and b.rounded().standby == 12.346


def test_a_short_jobs_line_names_what_it_lost():
    # an empty script on 2 workers: 0.1 s, every part under 0.05 s (it said "73.1 % of 0.1 s: nothing lost")
    b = Breakdown(wall=0.1, training=0.0731, startup=0.0199, rendezvous=0.007, steps_known=True)
    assert b.line() == "goodput 73.1 % of 0.1 s: start-up 20 ms, rendezvous and waiting 7 ms"
    assert Breakdown(wall=8.0, training=8.0, steps_known=True).line() == "goodput 100.0 % of 8.0 s: nothing lost"


def test_what_a_line_leaves_out_is_under_3_percent_of_the_wall():
    b = Breakdown(
        wall=8.0, training=7.85, startup=0.049, rendezvous=0.048, stall=0.047, shutdown=0.003, steps_known=True
    )
    assert b.line() == "goodput 98.1 % of 8.0 s: start-up 49 ms, rendezvous and waiting 48 ms, stalls 47 ms"
    tiny = Breakdown(wall=100.0, training=99.99, shutdown=0.01, steps_known=True)
    assert tiny.line() == "goodput 100.0 % of 1 m 40 s: 10 ms lost in all"


def test_in_place_a_node_that_started_no_worker_lost_the_time_to_its_survivors_next_step():
    # node 0's survivors wait in the recovery while the replacement starts on node 1; they step again at 5.8
    g = Ledger(0.0)
    g.running(0.0, {0, 1}, 0)
    steps(g, 1.0, 1)
    g.rendezvous(5.0)  # the in-place round is asked for (no stop on this node)
    g.formed(5.1)
    g.running(5.3, {0, 1}, 1, went_on=True)  # nothing started here: its survivors are the round's ranks
    g.steps(5.3, {0: (1, 4.9), 1: (1, 4.95)})  # their reports from before the recovery: not a first step
    steps(g, 5.8, 2)
    b = g.breakdown(20.0)
    assert b.restart == approx(0.8) and b.training == approx(20.0 - 1.0 - 0.8), b  # open to the end before


def test_without_steps_the_window_ends_where_the_workers_group_formed():
    g = Ledger(0.0)
    g.formed(1.0)  # 1 s forming the round
    g.running(1.5, {0, 1}, 0)
    g.group_formed(4.0)  # their imports and init_process_group: start-up
    g.failure(10.0)
    g.rendezvous(10.2)
    g.formed(10.3)
    g.running(10.4, {0, 1}, 1)
    g.group_formed(13.0)
    g.done(20.0)
    g.finish(20.0)
    b = g.breakdown(20.0)
    assert (b.rendezvous, b.startup, b.restart) == (approx(1.0), approx(3.0), approx(3.0)), b
    assert b.training == approx(6.0 + 7.0) and b.formed_known and not b.steps_known
    assert "lost time measured to the workers' process group forming" in b.line()


def test_a_group_formed_before_the_round_ran_or_with_steps_known_changes_nothing():
    g = Ledger(0.0)
    g.running(0.0, {0}, 0)
    g.group_formed(-1.0)  # a round before this one's (in place keeps the store and its word)
    steps(g, 2.0, 1, (0,))
    g.group_formed(1.0)  # the first step ended the window: a finer point
    b = g.breakdown(3.0)
    assert b.startup == approx(2.0) and not b.formed_known, b
