"""The supervisor driven in-process for unit tests: fake worker processes (through a `process.Spawner`),
a fake clock and a fake rendezvous in a `Rig`, whose `step()`s a test turns; no worker runs, nothing sleeps.
A module using it imports `no_process_sweep` too (its autouse fixture: the sweep sees no real children)."""

from __future__ import annotations

import signal

import pytest

from launcher.agent import process
from launcher.agent.bootstrap import DISABLE_VAR
from launcher.agent.parts import Identity, Launching, Observers
from launcher.agent.supervisor import Supervisor
from launcher.config import from_flags
from launcher.errors import RestartBudgetExhausted
from launcher.rendezvous.api import Cause
from launcher.spec import Exit, GroupState, Round
from support.clock import FakeClock


class FakeProc:
    """A worker that never runs: it ends when the test says so, or when sent a signal it does not ignore
    (`frozen`: stopped, as by SIGSTOP, it acts on SIGKILL alone)."""

    pidfd = None
    stdout = None
    stderr = None
    forked = False

    def __init__(self, pid: int, env: dict, ignore: frozenset[int] = frozenset()):
        self.pid, self.env, self.ignore = pid, env, ignore
        self.code: int | None = None
        self.signals: list[int] = []  # to the group
        self.sent: list[int] = []  # to the process alone
        self.closed = False
        self.frozen = False

    @property
    def rank(self) -> int:
        return int(self.env["RANK"])

    def exit(self, code: int) -> None:
        if self.code is None:
            self.code = code

    def poll(self) -> Exit | None:
        return None if self.code is None else Exit(self.code)

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL or (sig not in self.ignore and not self.frozen):
            self.exit(-sig)

    def send(self, sig: int) -> None:
        self.sent.append(sig)
        if sig == signal.SIGKILL or (
            sig not in self.ignore and not self.frozen and sig not in (signal.SIGUSR1, signal.SIGUSR2)
        ):
            self.exit(-sig)

    def stopped(self) -> bool:
        return self.frozen and self.code is None

    def close(self) -> None:
        self.closed = True


class Spawner:
    def __init__(self, ignore: frozenset[int] = frozenset()):
        self.procs: list[FakeProc] = []
        self.ignore = ignore

    def __call__(self, argv, env) -> FakeProc:
        p = FakeProc(10_000 + len(self.procs), env, self.ignore)
        self.procs.append(p)
        return p

    def live(self) -> list[FakeProc]:
        return [p for p in self.procs if p.code is None]


class FakeRendezvous:
    """One node alone; charges a job-wide budget on Cause.FAILURE like the protocol does."""

    def __init__(self, max_restarts: int, nproc: int):
        self.max_restarts, self.nproc = max_restarts, nproc
        self.round, self.restarts = -1, 0
        self.causes: list[Cause] = []
        self.watched: list[int] = []
        self.verdicts: list = []

    def next_round(self, cause: Cause, verdict=None, waiting=None) -> Round:
        self.causes.append(cause)
        self.verdicts.append(verdict)
        if cause is Cause.FAILURE:
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise RestartBudgetExhausted(f"no restarts left (--max_restarts {self.max_restarts})")
        self.round += 1
        return Round(
            run_id="unit",
            round=self.round,
            restart_count=self.restarts,
            group_rank=0,
            group_world_size=1,
            rank_offset=0,
            world_size=self.nproc,
            master_addr="127.0.0.1",
            master_port=29500,
        )

    def watch(self, rnd: Round, post) -> None:
        self.watched.append(rnd.round)

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        pass


class NoLogs:
    def disk_error(self, path, error) -> None:
        raise AssertionError(f"disk error {path}: {error}")

    def failed_first(self, rank: int, what: str) -> None:
        pass

    def new_round(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_process_sweep(monkeypatch):
    """The sweep and reaping look at this process's real children (pytest's): none of them are workers."""
    monkeypatch.setattr(process, "descendants", lambda exclude=(): [])
    monkeypatch.setattr(process, "reap_adopted", lambda owned: None)


# No bootstrap store: the workers are fakes, and a real server on the rounds' port 29500 would outlive the
# test (it closes when `Supervisor.run` returns, which a rig that steps the loop never calls)
RIG_ENVIRON = {"PATH": "/usr/bin", DISABLE_VAR: "1"}


class Rig:
    def __init__(self, tmp_path, nproc: int = 2, max_restarts: int = 0, ignore: frozenset[int] = frozenset(), **flags):
        self.config = from_flags(
            training_script="worker",
            no_python=True,
            nproc_per_node=str(nproc),
            max_restarts=max_restarts,
            environ={},
            quiet=True,
            **flags,
        )
        self.clock = FakeClock(1000.0)
        self.spawn = Spawner(ignore)
        self.rdzv = FakeRendezvous(max_restarts, nproc)
        self.events: list[tuple[str, dict]] = []
        self.sup = Supervisor(
            self.config,
            self.rdzv,
            Launching(NoLogs(), str(tmp_path), process.Spawner(self.spawn), RIG_ENVIRON),
            identity=Identity("unit", "testhost"),
            observers=Observers(sinks=[lambda kind, fields: self.events.append((kind, fields))]),
            clock=self.clock,
        )

    def turn(self, until, what: str, turns: int = 50) -> None:
        """Step the loop until `until()`; a round asked of the rendezvous thread wakes the loop at once."""
        for _ in range(turns):
            if until():
                return
            self.sup.step(timeout=1.0 if self.sup.state is GroupState.RENDEZVOUS else 0)
        raise AssertionError(f"never reached: {what} (state {self.sup.state.name}, events {self.kinds()})")

    def watch(self, seconds: float, every: float = 0.5) -> None:
        """Let `seconds` pass on the clock with the loop looking every `every` s, as a running agent does
        (a jump with no look between is a stall of the agent, which no hang counts: agent/awake.py)."""
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + every)
            self.sup.step(timeout=0)

    def running(self, count: int) -> None:
        """Wait for the group to be RUNNING with its `count`-th spawn done."""
        self.turn(
            lambda: self.sup.state is GroupState.RUNNING and len(self.spawn.procs) >= count, f"{count} workers spawned"
        )

    def start(self) -> None:
        self.sup.begin_round(Cause.START)
        self.running(self.config.nproc_per_node)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]
