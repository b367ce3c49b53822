"""The straggler judge as a pure function of the job's step rates and the time, and its flags."""

from __future__ import annotations

import re

import pytest

from launcher.config import from_flags
from launcher.errors import ConfigError
from launcher.telemetry.stragglers import Judge


def test_a_rank_below_the_threshold_is_flagged_only_after_the_period_and_cleared_when_it_catches_up():
    judge = Judge(threshold=0.5, period=30)
    slow = {0: 10.0, 1: 10.5, 2: 9.5, 3: 4.0}
    assert judge(slow, now=0).ranks == {}
    assert judge(slow, now=29).ranks == {}
    flagged = judge(slow, now=30)
    assert flagged.ranks == {3: 4.0} and flagged.median == pytest.approx(9.75)
    assert judge({**slow, 3: 9.0}, now=32).ranks == {}  # caught up: cleared, and the period starts over
    assert judge(slow, now=33).ranks == {}


def test_a_uniformly_slow_job_and_too_few_ranks_and_off_flag_nothing():
    assert Judge(0.5, 0)({0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1}, now=100).ranks == {}
    assert Judge(0.5, 0)({0: 10.0, 1: 1.0}, now=100) is None  # no median worth the name
    assert Judge(0.0, 0)({0: 10.0, 1: 10.0, 2: 1.0}, now=100) is None
    assert Judge(0.5, 0)({0: 0.0, 1: 0.0, 2: 0.0}, now=100) is None


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"straggler_threshold": "1"}, "--straggler_threshold '1' must be from 0 (off) to below 1"),
        ({"straggler_threshold": "x"}, "--straggler_threshold 'x' is not a number"),
        ({"straggler_period": "0.5"}, "--straggler_period '0.5' must be at least 1"),
    ],
)
def test_straggler_flags_are_checked(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_flags(training_script="true", no_python=True, environ={}, **flags)
    config = from_flags(training_script="true", no_python=True, environ={})
    assert (config.straggler_threshold, config.straggler_period) == (0.5, 60.0)
