"""How a process ended, decoded once (`Exit`), the exit-code table, the group's state machine, the
root cause of a run, and signal capture: one post per burst of the same signal, restored after."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from launcher.agent.signals import SignalReceived, capture_signals, once_per_burst
from launcher.errors import (
    EXIT_USAGE,
    ConfigError,
    LauncherError,
    RendezvousError,
    RestartBudgetExhausted,
    exit_code_for_signal,
)
from launcher.spec import Exit, Failure, GroupState, RunResult, Verdict, Worker

# ---------------------------------------------------------------------------- exits and verdicts


@pytest.mark.parametrize(
    "code, says",
    [
        (0, "exited with code 0"),
        (3, "exited with code 3"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (-signal.SIGSEGV, "killed by SIGSEGV: segmentation fault in native code"),
        (-signal.SIGBUS, "killed by SIGBUS: bus error: shared memory (/dev/shm) too small?"),
        (-99, "killed by signal 99"),
    ],
)
def test_an_exit_describes_itself(code, says):
    e = Exit(code)
    assert e.describe() == says
    assert e.ok == (code == 0) and e.signal == (-code if code < 0 else None)


def test_exit_codes():
    assert exit_code_for_signal(signal.SIGTERM) == 143 and exit_code_for_signal(signal.SIGINT) == 130
    assert ConfigError("x").exit_code == EXIT_USAGE == 2
    assert LauncherError("x").exit_code == RendezvousError("x").exit_code == RestartBudgetExhausted("x").exit_code == 1


def test_a_verdict_names_the_rank_its_host_and_the_attempt():
    v = Verdict(host="node3", node="n3", rank=7, local_rank=1, returncode=-signal.SIGABRT, round=2)
    assert v.describe() == (
        "rank 7 (local rank 1) on node3 killed by SIGABRT: aborted: a C++ exception or an assertion in native code"
        " (attempt 2)"
    )


def failure(rank: int, at: float, round: int = 0, collateral: bool = False) -> Failure:
    return Failure(Worker(rank, rank, 4, 4), 100 + rank, Exit(1), at, "h", round, collateral)


def test_the_root_cause_is_the_first_failure_not_caused_by_the_launcher_in_the_last_round():
    assert RunResult(GroupState.FAILED, 1).root_cause is None
    only_collateral = RunResult(GroupState.FAILED, 1, (failure(0, 1.0, collateral=True),))
    assert only_collateral.root_cause is None
    result = RunResult(
        GroupState.FAILED,
        1,
        (
            failure(0, 1.0, round=0),  # an earlier round's failure: restarted since
            failure(1, 5.0, round=1, collateral=True),  # stopped by the launcher first
            failure(2, 7.0, round=1),
            failure(3, 6.0, round=1),
        ),
    )
    assert result.root_cause.worker.rank == 3


def test_the_group_state_machine_only_moves_forward():
    from launcher.spec import TRANSITIONS

    assert not TRANSITIONS[GroupState.SUCCEEDED] and not TRANSITIONS[GroupState.FAILED]
    assert GroupState.RUNNING in TRANSITIONS[GroupState.RENDEZVOUS]
    assert GroupState.RENDEZVOUS in TRANSITIONS[GroupState.STOPPING]  # a restart re-forms
    assert GroupState.RENDEZVOUS not in TRANSITIONS[GroupState.RUNNING]  # it stops its workers first


# ---------------------------------------------------------------------------- signals


def test_the_same_signal_twice_in_one_burst_is_posted_once_other_signals_each():
    posted: list[object] = []
    handler = once_per_burst(posted.append, window=3600.0)
    handler(signal.SIGTERM, None)
    handler(signal.SIGTERM, None)  # `timeout` signals the launcher, then its process group
    handler(signal.SIGINT, None)
    assert posted == [SignalReceived(signal.SIGTERM), SignalReceived(signal.SIGINT)]
    assert posted[0].name == "SIGTERM"


def test_without_a_window_every_delivery_counts():
    posted: list[object] = []
    handler = once_per_burst(posted.append, window=0.0)
    for _ in range(3):
        handler(signal.SIGINT, None)
    assert posted == [SignalReceived(signal.SIGINT)] * 3


def test_capture_installs_its_handler_and_restores_the_previous_one():
    posted: list[object] = []
    before = signal.getsignal(signal.SIGUSR2)
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    try:
        with capture_signals([signal.SIGUSR2], posted.append, w.fileno()):
            os.kill(os.getpid(), signal.SIGUSR2)  # to this very process: the handler runs in the main thread
            assert r.recv(16)  # the wake-up byte that ends the supervisor's select()
        assert posted == [SignalReceived(signal.SIGUSR2)]
        assert signal.getsignal(signal.SIGUSR2) is before
    finally:
        r.close()
        w.close()


def test_capture_off_the_main_thread_installs_nothing():
    import threading

    before = signal.getsignal(signal.SIGUSR2)
    seen: list[object] = []

    def off_main() -> None:
        with capture_signals([signal.SIGUSR2], print, -1):
            seen.append(signal.getsignal(signal.SIGUSR2))

    t = threading.Thread(target=off_main)
    t.start()
    t.join(5)
    assert seen == [before]
