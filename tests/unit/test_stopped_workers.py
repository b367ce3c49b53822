"""A stopped worker (SIGSTOP, a debugger's hold: it acts on no signal but SIGKILL) when its group stops or
it is found hung: SIGKILLed at once, never waited on for the --shutdown_timeout grace. In-process, on
tests/support/supervisor_rig.py's `Rig` (fake workers, clock and rendezvous); the clock never moves past the grace."""

from __future__ import annotations

import signal

from support.supervisor_rig import Rig, no_process_sweep  # noqa: F401 (its autouse fixture)

from launcher.rendezvous.api import Cause, MembershipChanged
from launcher.spec import GroupState


def test_a_stopped_worker_is_killed_at_once_when_its_group_restarts(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=1, shutdown_timeout="30")
    rig.start()
    p0, p1 = rig.spawn.procs
    p1.frozen = True
    p0.exit(1)
    rig.sup.step(timeout=0)  # the stop: SIGKILL to the stopped one, before the SIGTERM it could not act on
    assert p1.sent == [signal.SIGKILL] and p1.code == -signal.SIGKILL
    rig.running(4)  # the next round at once, the clock where it was
    assert rig.clock.now == 1000.0 and rig.rdzv.causes == [Cause.START, Cause.FAILURE]
    assert [f.worker.rank for f in rig.sup.failures if f.collateral] == [1]


def test_a_worker_stopped_during_the_grace_is_killed_at_the_next_look(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=1, shutdown_timeout="30", ignore=frozenset({signal.SIGTERM}))
    rig.start()
    p0, p1 = rig.spawn.procs
    rig.sup.post(MembershipChanged("a node joined"))
    rig.sup.step(timeout=0)
    assert rig.sup.state is GroupState.STOPPING and p0.signals == p1.signals == [signal.SIGTERM]
    rig.watch(5)  # saving a checkpoint on SIGTERM, say: the grace is theirs
    assert rig.sup.state is GroupState.STOPPING and p0.code is None and p1.code is None
    p0.exit(0)
    p1.frozen = True
    rig.watch(0.5)
    assert p1.sent == [signal.SIGKILL] and p1.signals == [signal.SIGTERM]
    rig.running(4)
    assert rig.clock.now == 1005.5 and rig.rdzv.causes == [Cause.START, Cause.MEMBERSHIP]


def test_a_hung_worker_that_is_stopped_is_killed_not_asked_for_its_stacks(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=1, hang_timeout="30", hang_startup_timeout="1")
    rig.start()
    p0, p1 = rig.spawn.procs
    p0.exit(0)
    p1.frozen = True
    rig.watch(31)  # SIGABRT would stay pending: faulthandler cannot run in a stopped process
    assert p1.sent == [signal.SIGKILL]
    rig.running(4)
    failure = rig.sup.failures[0]
    assert failure.worker.rank == 1 and not failure.collateral
    assert failure.reason == "hung: no progress for 30 s, stopped (SIGSTOP or a debugger); killed, no stacks"
