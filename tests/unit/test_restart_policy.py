"""The restart policy's bookkeeping (`policy.History`) and its flags, in-process: rounds are fed by
hand with how long they ran, whether they failed, the best step and the root cause."""

from __future__ import annotations

import pytest

from launcher.config import from_flags
from launcher.errors import (
    ConfigError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
    RestartBudgetExhausted,
)
from launcher.exitcodes import ExitCode, passed_through
from launcher.parsers import parse_policy
from launcher.policy.restart import History, Signature, Stop, requeue_after
from launcher.spec import RestartPolicy

NAN = Signature(rank=1, returncode=1, error="RuntimeError: loss is NaN", step=700)


def fail(h: History, ran: float = 1.0, step: int | None = None, cause: Signature | None = None):
    return h.round_ended(ran, True, step, cause)


def test_the_first_restart_is_immediate_then_quick_failures_back_off_doubling_to_the_cap():
    h = History(RestartPolicy(quick=60, backoff=1, backoff_max=5))
    assert [fail(h).delay for _ in range(6)] == [0, 1, 2, 4, 5, 5]


def test_a_failure_after_a_long_run_or_a_success_resets_the_backoff():
    h = History(RestartPolicy(quick=60, backoff=1, backoff_max=60))
    assert [fail(h).delay for _ in range(3)] == [0, 1, 2]
    assert fail(h, ran=61).delay == 0  # ran past `quick`: the first of a new streak
    assert fail(h).delay == 1
    h.round_ended(1.0, False, None)  # a round ended without a failure (a membership change)
    assert fail(h).delay == 0


def test_no_progress_stops_after_n_failed_rounds_in_a_row_below_the_best_step():
    h = History(RestartPolicy(no_progress=3))
    assert fail(h, step=100).stop is None  # the best so far
    assert fail(h, step=150).stop is None  # progress: the count starts again
    assert fail(h, step=120).stop is None
    assert fail(h, step=None).stop is None  # died before its first step
    decision = fail(h, step=150)  # equal is not past
    assert decision.stop is Stop.NO_PROGRESS and decision.stop.exit_code == ExitCode.DO_NOT_REQUEUE
    assert decision.why == "3 restarts in a row made no progress past step 150 (--restart_policy no_progress=3)"


def test_a_job_that_never_reports_a_step_is_never_stopped_for_no_progress():
    h = History(RestartPolicy(no_progress=2))
    assert all(fail(h).stop is None for _ in range(10))


def test_the_same_rank_failing_with_the_same_error_at_the_same_step_twice_is_deterministic():
    h = History(RestartPolicy(quarantine_window=0))
    assert fail(h, step=700, cause=NAN).stop is None
    assert fail(h, step=700, cause=Signature(1, 1, "RuntimeError: loss is NaN", 650)).stop is None  # another step
    assert fail(h, step=700, cause=Signature(1, 2, "RuntimeError: loss is NaN", 700)).stop is None  # another code
    decision = fail(h, step=700, cause=NAN)
    assert decision.stop is Stop.DETERMINISTIC and decision.stop.exit_code == 70
    assert decision.why == "rank 1 failed twice with the same error at step 700: RuntimeError: loss is NaN"


def test_the_same_error_from_another_rank_is_the_same_failure():
    # every rank hits it; which fails first is chance, and the job must end the same way either way
    h = History(RestartPolicy(quarantine_window=0))
    assert fail(h, step=700, cause=NAN).stop is None
    decision = fail(h, step=700, cause=Signature(0, 1, "RuntimeError: loss is NaN", 700))
    assert decision.stop is Stop.DETERMINISTIC
    assert decision.why == "ranks 1 and 0 failed with the same error at step 700: RuntimeError: loss is NaN"


def test_bare_exit_codes_never_count_as_the_same_error():
    h = History(RestartPolicy(quarantine_window=0))
    bare = Signature(0, 1, "", None)
    assert fail(h, cause=bare).stop is None and fail(h, cause=bare).stop is None


def test_deterministic_detection_can_be_turned_off():
    h = History(parse_policy({"deterministic": "off"}, {}))
    assert fail(h, cause=NAN).stop is None and fail(h, cause=NAN).stop is None


def test_a_node_whose_workers_failed_in_k_of_its_last_rounds_is_quarantined():
    h = History(RestartPolicy(quarantine_after=2, quarantine_window=3))
    assert fail(h, cause=Signature(0, 1, "a", None)).stop is None
    assert fail(h).stop is None  # a failure on another node: not this node's
    assert fail(h).stop is None
    assert fail(h).stop is None  # the window (3 rounds) no longer holds the first
    assert fail(h, cause=Signature(0, 1, "b", None)).stop is None  # 1 of the last 3
    decision = fail(h, cause=Signature(0, 1, "c", None))
    assert History(h.policy, multi_node=False).round_ended(1.0, True, None, NAN).stop is None
    assert decision.stop is Stop.QUARANTINE and decision.stop.exit_code == ExitCode.QUARANTINED
    assert decision.why == "its workers failed in 2 of its last 3 rounds (--quarantine after=2,window=3)"


def test_a_deterministic_failure_is_the_programs_not_the_nodes():
    """The same error twice stops the job as deterministic before the node could be blamed."""
    h = History(RestartPolicy(quarantine_after=2, quarantine_window=3))
    fail(h, cause=NAN)
    assert fail(h, cause=NAN).stop is Stop.DETERMINISTIC


def test_the_flags_parse_into_one_policy():
    config = from_flags(
        training_script="x",
        no_python=True,
        restart_policy="quick=30,backoff=0.5,backoff_max=10,no_progress=0",
        quarantine="after=2,window=4,cooldown=600",
        health_check=" nvidia-smi -L ",
        environ={},
    )
    assert config.restart_policy == RestartPolicy(
        quick=30, backoff=0.5, backoff_max=10, no_progress=0, quarantine_after=2, quarantine_window=4,
        quarantine_cooldown=600,
    )  # fmt: skip
    assert config.health_check == "nvidia-smi -L" and config.health_check_timeout == 60
    assert from_flags(training_script="x", no_python=True, environ={}).restart_policy == RestartPolicy()


@pytest.mark.parametrize(
    "restart, quarantine, message",
    [
        ({"backof": "1"}, {}, "--restart_policy key 'backof' is unknown"),
        ({"backoff": "soon"}, {}, "is not a number of seconds"),
        ({"backoff": "10", "backoff_max": "5"}, {}, "backoff_max=5 is below backoff=10"),
        ({"no_progress": "-1"}, {}, "--restart_policy no_progress=-1 must be 0 or more"),
        ({"deterministic": "maybe"}, {}, "say on or off"),
        ({}, {"after": "4", "window": "3"}, "--quarantine after=4 must be from 1 to window=3"),
        ({}, {"k": "1"}, "--quarantine key 'k' is unknown"),
    ],
)
def test_bad_policy_values_name_the_fix(restart, quarantine, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(restart, quarantine)


def test_a_worker_code_never_passes_through_as_a_policy_code():
    assert [passed_through(c) for c in (3, 69, 70, 75, 125, 126, -11, 0)] == [3, 1, 1, 1, 125, 1, 1, 1]


def test_what_a_requeue_may_cure():
    spent = RestartBudgetExhausted("no restarts left (--max_restarts 3)")
    closed_with_verdict = RendezvousClosedError("the job was closed: restart budget spent", verdict=object())
    lost = RendezvousClosedError("the job was closed: node with group rank 1 died; 1 node(s) left, fewer than 2")
    timeout = RendezvousTimeoutError("no round formed within 600 s (join_timeout)")
    assert requeue_after(spent, ran=True, budget=3) and requeue_after(closed_with_verdict, ran=True, budget=3)
    assert not requeue_after(spent, ran=True, budget=0)  # one failure seen: the worker's own code passes through
    assert requeue_after(lost, ran=True, budget=0) and requeue_after(timeout, ran=True, budget=0)  # nodes lost
    assert not requeue_after(lost, ran=False, budget=3)  # never ran (a spare, a late node): not this rule's
    assert not requeue_after(timeout, ran=False, budget=3)  # the job never formed: a typo in the endpoint?
    assert not requeue_after(RendezvousConnectionError("cannot reach etcd"), ran=True, budget=3)
