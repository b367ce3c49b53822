"""The supervisor's state machine, driven in-process on tests/support/supervisor_rig.py's `Rig`: fake worker
processes (through a `process.Spawner`), a fake clock (through `clock=`) and a fake rendezvous. No worker
process runs and nothing sleeps; each test turns the loop with `step()` and checks the group state, the
signals sent and the result."""

from __future__ import annotations

import errno
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from support.supervisor_rig import Rig, no_process_sweep  # noqa: F401 (its autouse fixture)

from launcher.agent import process
from launcher.agent.signals import SignalReceived
from launcher.errors import RendezvousClosedError
from launcher.rendezvous.api import Cause, MembershipChanged, WaitReport
from launcher.spec import GroupState, Round, Verdict
from launcher.telemetry.summary import summary_lines


def test_every_worker_succeeds(tmp_path):
    rig = Rig(tmp_path, nproc=3)
    rig.start()
    assert [p.rank for p in rig.spawn.procs] == [0, 1, 2]
    assert {p.env["WORLD_SIZE"] for p in rig.spawn.procs} == {"3"}
    assert rig.rdzv.watched == [0]
    for p in rig.spawn.procs[:2]:
        p.exit(0)
    rig.sup.step(timeout=0)
    assert rig.sup.state is GroupState.RUNNING  # one still runs
    rig.spawn.procs[2].exit(0)
    rig.sup.step(timeout=0)
    result = rig.sup.result()
    assert result.state is GroupState.SUCCEEDED and result.exit_code == 0 and result.failures == ()
    assert all(p.closed and p.signals == [] for p in rig.spawn.procs)
    assert rig.kinds() == ["rendezvous", "starting", "spawn", "spawn", "spawn", "running", "exit", "exit", "exit"]
    assert summary_lines(result) == []


def test_the_round_is_watched_before_its_workers_start(tmp_path):
    """Starting workers may wait (a zygote still importing): peers must keep seeing this node alive."""
    rig = Rig(tmp_path, nproc=2)
    seen: list[list[int]] = []
    spawn = rig.spawn.__call__
    rig.sup.launching.starter = process.Spawner(
        lambda argv, env: seen.append(list(rig.rdzv.watched)) or spawn(argv, env)
    )
    rig.start()
    assert seen == [[0], [0]]


def test_a_failure_stops_the_group_and_restarts_it(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=1)
    rig.start()
    first = list(rig.spawn.procs)
    first[1].exit(7)
    rig.sup.step(timeout=0)
    # rank 1 failed: rank 0 is asked to stop (SIGTERM to its group), and the group restarts
    assert first[0].signals == [signal.SIGTERM]
    rig.running(4)
    second = rig.spawn.procs[2:]
    assert rig.rdzv.causes == [Cause.START, Cause.FAILURE]
    assert {p.env["TORCHELASTIC_RESTART_COUNT"] for p in second} == {"1"}
    assert rig.sup.round.round == 1
    kinds = rig.kinds()
    assert kinds.index("stopping") < kinds.index("rendezvous", 1) < len(kinds) - 1
    for p in second:
        p.exit(0)
    rig.sup.step(timeout=0)
    result = rig.sup.result()
    assert result.exit_code == 0 and result.restarts == 1
    assert [(f.worker.rank, f.exit.returncode, f.collateral) for f in result.failures] == [
        (1, 7, False),
        (0, -15, True),
    ]


def test_spent_budget_asks_for_a_requeue(tmp_path):
    """Restarts spent on failures the policy did not find deterministic: exit 75, a requeue may pass."""
    rig = Rig(tmp_path, nproc=2, max_restarts=1)
    rig.start()
    rig.spawn.procs[0].exit(3)
    rig.running(4)
    rig.clock.now += 5
    rig.spawn.procs[3].exit(42)  # the root cause of the last round: rank 1 this time
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED once the budget is spent")
    result = rig.sup.result()
    assert result.exit_code == 75 and result.restarts == 1
    assert "no restarts left" in result.message
    root = result.root_cause
    assert (root.worker.rank, root.exit.returncode, root.round) == (1, 42, 1)
    lines = summary_lines(result)
    assert lines[0] == "job failed (exit code 75: requeue) after 1 restart(s)"
    assert lines[1] == "reason: no restarts left (--max_restarts 1)"
    assert lines[2].startswith(
        "root cause: rank 1 (local rank 1) on testhost, pid 10003 exited with code 42 (attempt 1)"
    )
    assert lines[-1] == "stopped by the launcher: rank 0 (pid 10002)"  # only the last round's collateral
    told = rig.rdzv.verdicts[-1]  # what the rendezvous publishes as the job's verdict when it closes the job
    assert (told.host, told.rank, told.local_rank, told.returncode, told.round) == ("testhost", 1, 1, 42, 1)


def test_a_job_closed_elsewhere_fails_with_the_remote_root_cause_first(tmp_path):
    rig = Rig(tmp_path, nproc=1)
    rig.start()
    verdict = Verdict(
        host="h2",
        node="h2:9",
        rank=3,
        local_rank=1,
        returncode=3,
        round=0,
        error="RuntimeError: loss is NaN",
        log="/logs/attempt_0/1/stderr.log",
    )
    reason = "restart budget spent (--max_restarts 0); closed by node h2:9"

    def closed(cause, verdict_=None, waiting=None):
        raise RendezvousClosedError(f"the job was closed: {reason}", verdict)

    rig.rdzv.next_round = closed
    rig.sup.post(MembershipChanged(reason, closed=True))
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED")
    result = rig.sup.result()
    assert result.exit_code == 3 and result.verdict == verdict  # the remote root cause's own code, as on its node
    assert summary_lines(result) == [
        "job failed (exit code 3) after 0 restart(s)",
        "root cause (remote, node h2:9): rank 3 (local rank 1) on h2 exited with code 3 (attempt 0)",
        "  error: RuntimeError: loss is NaN",
        "  log: /logs/attempt_0/1/stderr.log (on h2)",
        f"reason: the job was closed: {reason}",
    ]


def test_a_code_outside_1_to_125_gives_exit_1(tmp_path):
    rig = Rig(tmp_path, nproc=1)
    rig.start()
    rig.spawn.procs[0].exit(-signal.SIGSEGV)
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED")
    result = rig.sup.result()
    assert result.exit_code == 1
    assert "killed by SIGSEGV: segmentation fault in native code" in summary_lines(result)[2]


def test_collateral_is_never_the_root_cause(tmp_path):
    """Rank 2 fails first; ranks 0 and 1 are stopped by the launcher, and rank 1 even dies of SIGKILL
    after the grace period: they are collateral, listed apart, whatever their exit."""
    rig = Rig(tmp_path, nproc=3, shutdown_timeout="5")
    rig.start()
    p0, p1, p2 = rig.spawn.procs
    p1.ignore = frozenset({signal.SIGTERM})
    p2.exit(9)
    rig.sup.step(timeout=0)
    assert rig.sup.state is GroupState.STOPPING and p0.code == -15 and p1.code is None
    rig.sup.step(timeout=0)
    assert p1.signals == [signal.SIGTERM]  # no SIGKILL before the deadline
    rig.clock.now += 5
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED after the SIGKILL")
    assert p1.signals == [signal.SIGTERM, signal.SIGKILL]
    result = rig.sup.result()
    assert result.exit_code == 9
    assert result.root_cause.worker.rank == 2
    assert sorted((f.worker.rank, f.collateral) for f in result.failures) == [(0, True), (1, True), (2, False)]
    lines = summary_lines(result)
    assert lines[-1] == "stopped by the launcher: rank 0 (pid 10000), rank 1 (pid 10001)"
    assert not any(l.startswith("also failed") for l in lines)


def test_failures_seen_together_are_both_reported_the_lowest_rank_first(tmp_path):
    rig = Rig(tmp_path, nproc=2)
    rig.start()
    rig.spawn.procs[1].exit(4)
    rig.spawn.procs[0].exit(5)  # before the loop turns: both are seen in one reap, at one time
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED")
    result = rig.sup.result()
    assert result.exit_code == 5 and result.root_cause.worker.rank == 0
    assert not any(f.collateral for f in result.failures)
    assert summary_lines(result)[-1] == "also failed: rank 1 (local rank 1) on testhost, pid 10001 exited with code 4"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_gracefully_and_exits_128_plus_n(tmp_path, signum):
    rig = Rig(tmp_path, nproc=2, max_restarts=3)
    rig.start()
    rig.sup.post(SignalReceived(signum))
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED after the signal")
    assert all(p.signals == [signum] for p in rig.spawn.procs)  # forwarded once, no SIGKILL
    result = rig.sup.result()
    assert result.exit_code == 128 + signum and result.signal == signum
    assert all(f.collateral for f in result.failures) and result.root_cause is None
    assert rig.rdzv.causes == [Cause.START]  # a signal is never restarted
    assert ("stopping", {"reason": "signal", "signal": signal.Signals(signum).name, "grace": 30.0}) in rig.events


def test_a_second_sigint_kills_at_once(tmp_path):
    rig = Rig(tmp_path, nproc=2, ignore=frozenset({signal.SIGINT}), shutdown_timeout="60")
    rig.start()
    rig.sup.post(SignalReceived(signal.SIGINT))
    rig.sup.step(timeout=0)
    rig.sup.step(timeout=0)
    assert rig.sup.state is GroupState.STOPPING
    assert all(p.signals == [signal.SIGINT] for p in rig.spawn.procs)  # the grace period runs
    rig.sup.post(SignalReceived(signal.SIGINT))
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED after the second SIGINT")
    assert all(p.signals == [signal.SIGINT, signal.SIGKILL] for p in rig.spawn.procs)
    assert rig.sup.result().exit_code == 130


def test_a_signal_during_rendezvous_fails_at_once(tmp_path):
    rig = Rig(tmp_path, nproc=1)
    rig.sup.post(SignalReceived(signal.SIGTERM))
    rig.sup.step(timeout=0)
    assert rig.sup.state is GroupState.FAILED
    assert rig.sup.result().exit_code == 143 and rig.spawn.procs == []


def test_a_passthrough_signal_reaches_the_workers_only(tmp_path):
    rig = Rig(tmp_path, nproc=2, passthrough_signals="SIGUSR1")
    rig.start()
    rig.sup.post(SignalReceived(signal.SIGUSR1))
    rig.sup.step(timeout=0)
    assert rig.sup.state is GroupState.RUNNING
    assert all(p.sent == [signal.SIGUSR1] and p.signals == [] for p in rig.spawn.procs)


def test_a_hang_is_a_failure_and_restarts_the_group(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=1, hang_timeout="30", hang_startup_timeout="1")
    rig.start()
    p0, p1 = rig.spawn.procs
    p0.exit(0)  # finished its work; only rank 1 is left, silent
    rig.watch(29)
    assert p1.sent == []  # not yet
    rig.watch(2)  # at the look at 30.5 s > 30 s: SIGABRT (faulthandler dumps the stacks), and it dies of it
    assert p1.sent == [signal.SIGABRT]
    assert ("hang", {"rank": 1, "pid": p1.pid, "idle": 30.5}) in rig.events
    rig.running(4)
    assert rig.rdzv.causes == [Cause.START, Cause.FAILURE]
    failure = rig.sup.failures[0]
    assert failure.worker.rank == 1 and not failure.collateral
    assert failure.reason == "hung: no progress for 30 s; stacks in its stderr"


def test_a_worker_not_yet_heard_from_is_starting_and_judged_by_the_startup_bound(tmp_path):
    """Before its first line or progress() call a worker is importing or setting up (seconds on a busy
    host): --hang_timeout does not judge it, --hang_startup_timeout does."""
    rig = Rig(tmp_path, nproc=1, max_restarts=1, hang_timeout="30", hang_startup_timeout="100")
    rig.start()
    p0 = rig.spawn.procs[0]
    rig.watch(99)
    assert p0.sent == []
    rig.watch(2)
    assert p0.sent == [signal.SIGABRT]
    assert [f["idle"] for k, f in rig.events if k == "hang"] == [pytest.approx(100.0, abs=0.6)]


def test_once_the_workers_report_steps_a_line_does_not_end_a_restarted_workers_startup(tmp_path):
    """A script that reports steps prints before its first one, then waits in its first collective for its
    slowest peer (a spare importing torch on a busy host): after a restart, its line alone does not put it
    under --hang_timeout; its first progress() call would (issue 32)."""
    rig = Rig(tmp_path, nproc=1, max_restarts=1, hang_timeout="30", hang_startup_timeout="100")
    rig.start()
    Path(rig.sup.members[0].progress_file).write_text("1")  # step 1: this node's workers report steps
    rig.watch(1)
    rig.spawn.procs[0].exit(1)
    rig.running(2)
    line = type("S", (), {"name": "stdout", "last_line": "start rank=0", "last_at": rig.clock.now})()
    rig.sup.members[0].streams = [line]
    rig.watch(60)
    assert rig.spawn.procs[1].sent == []  # past --hang_timeout, before its first step: starting
    rig.watch(41)
    assert rig.spawn.procs[1].sent == [signal.SIGABRT]  # --hang_startup_timeout


def test_a_stall_of_the_agent_is_no_workers_silence(tmp_path):
    """The node stopped whole for 40 s (agent and workers): on resume no worker is hung; a worker silent
    for 30 s of the agent's running time after it is (issue 32)."""
    rig = Rig(tmp_path, nproc=1, max_restarts=1, hang_timeout="30", hang_startup_timeout="1")
    rig.start()
    p0 = rig.spawn.procs[0]
    rig.watch(5)
    rig.clock.now += 40  # no look for 40 s: the agent was stopped
    rig.sup.step(timeout=0)
    assert p0.sent == [] and ("hang", {"rank": 0, "pid": p0.pid, "idle": 45.0}) not in rig.events
    rig.watch(24.5)
    assert p0.sent == []  # 29.5 s of running time
    rig.watch(1)
    assert p0.sent == [signal.SIGABRT]
    assert [f["idle"] for k, f in rig.events if k == "hang"] == [pytest.approx(30.0, abs=0.6)]


def test_a_hung_worker_stopped_by_the_launcher_is_still_the_root_cause(tmp_path):
    """A hung worker that ignores SIGABRT is then stopped with the group: it stays the root cause."""
    rig = Rig(
        tmp_path,
        nproc=1,
        hang_timeout="10",
        hang_startup_timeout="1",
        ignore=frozenset({signal.SIGABRT, signal.SIGTERM}),
    )
    rig.start()
    rig.watch(11)
    assert rig.spawn.procs[0].sent == [signal.SIGABRT] and rig.sup.state is GroupState.RUNNING
    rig.sup.post(SignalReceived(signal.SIGTERM))
    rig.sup.step(timeout=0)
    rig.clock.now += 31
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED")
    result = rig.sup.result()
    assert result.exit_code == 143
    assert result.root_cause is not None and result.root_cause.reason.startswith("hung:")


def test_a_membership_change_re_forms_without_charging_the_budget(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=0)
    rig.start()
    rig.sup.post(MembershipChanged("a node joined"))
    rig.running(2)
    assert rig.rdzv.causes == [Cause.START, Cause.MEMBERSHIP]
    assert rig.sup.round.restart_count == 0
    assert rig.sup.failures[0].collateral


def joined_round(rig: Rig, restarts: int) -> Round:
    """The next round as another node formed it, this node in it (the rendezvous is not asked again)."""
    rig.rdzv.round += 1
    return replace(rig.sup.round, round=rig.rdzv.round, restart_count=restarts)


def test_a_restart_in_a_round_joined_already_heartbeats_it_and_starts_there(tmp_path):
    """recovery.py: another node restarts its workers in the round this node joined in place. The slow stop
    (workers that ignore SIGTERM) heartbeats that round, and the fresh workers start in it: no round more."""
    rig = Rig(tmp_path, nproc=2, max_restarts=1, ignore=frozenset({signal.SIGTERM}), recovery="in-place")
    rig.start()
    old = rig.spawn.procs[:2]
    rnd = joined_round(rig, 1)
    rig.sup.in_place._restart_in(rnd)
    assert rig.rdzv.watched == [0, 1] and rig.sup.state is GroupState.STOPPING  # heartbeating round 1 at once
    rig.watch(rig.config.shutdown_timeout + 1)  # SIGTERM ignored: SIGKILL at the deadline
    rig.running(4)
    assert all(p.code == -signal.SIGKILL for p in old)
    assert rig.rdzv.causes == [Cause.START] and rig.rdzv.watched == [0, 1]  # no rendezvous asked, no watch twice
    assert {p.env["LAUNCHER_ROUND"] for p in rig.spawn.procs[2:]} == {"1"} and rig.sup.round.restart_count == 1


def test_a_round_joined_already_that_ends_during_the_stop_is_left_for_the_next(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=1, ignore=frozenset({signal.SIGTERM}), recovery="in-place")
    rig.start()
    rig.sup.in_place._restart_in(joined_round(rig, 0))
    rig.sup.post(MembershipChanged("a node died"))  # round 1 ended before its workers started
    rig.watch(rig.config.shutdown_timeout + 1)
    rig.running(2)
    assert rig.rdzv.causes == [Cause.START, Cause.MEMBERSHIP] and rig.sup.round.round == 2
    assert rig.spawn.procs[1].env["LAUNCHER_ROUND"] == "2"


def test_a_rendezvous_error_fails_with_its_message(tmp_path):
    rig = Rig(tmp_path, nproc=1)

    def broken(cause, verdict=None, waiting=None):
        raise KeyError("boom")

    rig.rdzv.next_round = broken
    rig.sup.begin_round(Cause.START)
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED")
    result = rig.sup.result()
    assert result.exit_code == 1 and result.message == "rendezvous failed unexpectedly: KeyError: 'boom'"
    assert summary_lines(result) == ["job failed (exit code 1) after 0 restart(s)", f"reason: {result.message}"]


def test_the_live_view_says_what_a_forming_round_waits_for(tmp_path):
    import io
    import threading

    from rich.console import Console

    from launcher.cli.view import render

    rig = Rig(tmp_path, nproc=1)
    release, real = threading.Event(), rig.rdzv.next_round
    line = "waiting for nodes in round 0: 1 joined (min 2, max 2); join timeout in 55 s"

    def forming(cause, verdict=None, waiting=None):
        waiting(WaitReport(line))
        release.wait(10)
        return real(cause, verdict)

    rig.rdzv.next_round = forming
    rig.sup.begin_round(Cause.START)
    rig.turn(lambda: rig.sup.snapshot().waiting == line, "the waiting line in the snapshot")
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(render(rig.sup.snapshot(), lambda pid: (None, None), now=0.0))
    assert "round 0 · rendezvous" in out.getvalue() and line in out.getvalue(), out.getvalue()
    release.set()
    rig.running(1)
    assert rig.sup.snapshot().waiting == ""


def test_a_transient_emfile_at_spawn_is_retried_not_fatal(tmp_path):
    """A store host out of descriptors for a moment (issue 23 item 1): the spawn is tried again."""
    rig = Rig(tmp_path, nproc=1)
    failures = [OSError(errno.EMFILE, "Too many open files")] * 2

    def spawn(argv, env):
        if failures:
            raise failures.pop()
        return rig.spawn(argv, env)

    rig.sup.launching.starter = process.Spawner(spawn)
    rig.start()
    assert not failures and rig.sup.state is GroupState.RUNNING


def test_an_emfile_that_lasts_fails_the_spawn_after_the_retry_window(tmp_path):
    rig = Rig(tmp_path, nproc=1)

    def spawn(argv, env):
        rig.clock.now += 20.0  # each try costs 20 s of the injected clock: the window closes on the third
        raise OSError(errno.EMFILE, "Too many open files")

    rig.sup.launching.starter = process.Spawner(spawn)
    rig.sup.begin_round(Cause.START)
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "the group failed")
    assert "Too many open files" in rig.sup.message
