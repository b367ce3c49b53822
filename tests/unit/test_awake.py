"""The hang clock leaves out the agent's own stalls (launcher/agent/awake.py)."""

import pytest

from launcher.agent.awake import AwakeClock

pytestmark = pytest.mark.timeout(10)


def looks(clock: AwakeClock, *times: float) -> list[float | None]:
    return [clock.tick(t) for t in times]


def test_looks_at_the_interval_or_a_little_late_are_no_stall():
    clock = AwakeClock(interval=0.1)
    assert looks(clock, 0.0, 0.1, 0.2, 0.9, 1.0) == [None] * 5  # a loaded scheduler: 0.7 s late
    assert clock.silence(1.0, now=1.0) == 1.0


def test_a_node_frozen_longer_than_the_hang_timeout_leaves_its_workers_silence_short():
    clock = AwakeClock(interval=0.1)
    looks(clock, 10.0, 10.1)
    assert clock.tick(14.1) == pytest.approx(4.0)  # agent and workers stopped 4 s, then resumed
    # the worker last spoke at 10.05: 4.05 s ago by the wall, 0.05 s of it while the agent ran
    assert clock.silence(4.05, now=14.1) == pytest.approx(0.05)
    looks(clock, 14.2, 14.3)
    assert clock.silence(4.25, now=14.3) == pytest.approx(0.25)  # the clock runs on after the resume


def test_a_silence_that_began_after_a_stall_is_counted_whole():
    clock = AwakeClock(interval=0.1)
    looks(clock, 0.0, 5.0, 5.1)
    assert clock.silence(0.05, now=5.1) == pytest.approx(0.05)
    looks(clock, *(5.1 + 0.1 * i for i in range(1, 60)))
    assert clock.silence(5.0, now=11.0) == pytest.approx(5.0)  # began at 6.0, after the stall


def test_a_long_monitor_interval_is_no_stall():
    clock = AwakeClock(interval=5.0)
    assert looks(clock, 0.0, 5.0, 10.0, 15.9) == [None] * 4
    assert clock.silence(15.0, now=15.9) == 15.0
