"""The vocabulary, as plain data: what to run, who runs it, how it ended."""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# marks every process an agent started (its workers, the zygote, the health check), for the orphan sweep
AGENT_ID_VAR = "LAUNCHER_AGENT_ID"

STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3


@dataclass(frozen=True)
class Std:
    """Which of stdout/stderr go somewhere, per local rank (torchrun's `-r`/`-t` syntax)."""

    default: int = STD_NONE
    per_rank: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def for_rank(self, local_rank: int) -> int:
        return self.per_rank.get(local_rank, self.default)

    def has(self, local_rank: int, stream: str) -> bool:
        """True if `stream` ("stdout"/"stderr") of `local_rank` is selected."""
        bit = STD_OUT if stream == "stdout" else STD_ERR
        return bool(self.for_rank(local_rank) & bit)


@dataclass(frozen=True)
class Round:
    """One agreed membership of the job: what a rendezvous hands this node."""

    run_id: str
    round: int  # bumps on every new round, restarts and membership changes alike
    restart_count: int  # failures charged to the job-wide budget so far
    group_rank: int  # this node's rank among the nodes
    group_world_size: int
    rank_offset: int  # global rank of this node's local rank 0
    world_size: int  # workers in the whole job
    master_addr: str
    master_port: int
    use_agent_store: bool = False  # False: worker rank 0 hosts the bootstrap store
    ifname: str | None = None  # the network interface this node reaches its peers through


@dataclass(frozen=True)
class Worker:
    """One worker's place in a round; rebuilt whole every round."""

    local_rank: int
    rank: int
    local_world_size: int
    world_size: int

    @property
    def role_rank(self) -> int:
        return self.rank


class RecoveryMode(enum.Enum):
    """What a failed worker costs the others (--recovery; docs/in-place.md)."""

    RESTART = "restart"  # stop every worker and start the group again
    IN_PLACE = "in-place"  # replace the failed worker alone; the survivors keep their state


class WorkerExit(enum.Enum):
    """How a spawned Python worker exits once its code has returned (--worker_exit; docs/preload.md)."""

    QUICK = "quick"  # python's exit steps, then os._exit: no interpreter finalisation (torch's teardown race)
    FINALIZE = "finalize"  # plain `python -u SCRIPT`: the interpreter finalises every module


class WorkerState(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by the launcher itself: collateral, never a root cause


class GroupState(enum.Enum):
    """The local worker group moves as a unit; only `Supervisor._set_state` changes it."""

    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TRANSITIONS: Mapping[GroupState, frozenset[GroupState]] = {
    GroupState.RENDEZVOUS: frozenset({GroupState.RUNNING, GroupState.FAILED, GroupState.SUCCEEDED}),  # a spare
    GroupState.RUNNING: frozenset({GroupState.STOPPING, GroupState.SUCCEEDED}),
    GroupState.STOPPING: frozenset({GroupState.RENDEZVOUS, GroupState.FAILED}),
    GroupState.SUCCEEDED: frozenset(),
    GroupState.FAILED: frozenset(),
}

SIGNAL_HINTS = {
    signal.SIGSEGV: "segmentation fault in native code",
    signal.SIGBUS: "bus error: shared memory (/dev/shm) too small?",
    signal.SIGABRT: "aborted: a C++ exception or an assertion in native code",
    signal.SIGFPE: "floating point exception in native code",
}


@dataclass(frozen=True)
class Exit:
    """How a process ended, decoded once from its return code."""

    returncode: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    def describe(self) -> str:
        if self.signal is None:
            return f"exited with code {self.returncode}"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        hint = SIGNAL_HINTS.get(self.signal)
        return f"killed by {name}" + (f": {hint}" if hint else "")


@dataclass(frozen=True)
class Failure:
    """One worker that did not exit 0, with what is known about why."""

    worker: Worker
    pid: int
    exit: Exit
    at: float  # monotonic time the launcher saw the exit
    host: str
    round: int
    collateral: bool  # True: the launcher stopped it itself
    reason: str = ""  # what the launcher knows beyond the exit, e.g. that it hung
    error_file: str | None = None
    log_files: tuple[str, ...] = ()
    step: int | None = None  # its last launcher.progress(step=) before it ended


@dataclass(frozen=True)
class Verdict:
    """The job's root cause as one node published it to the others when it closed the job.

    Small and bounded (the protocol writes and checks it: `rendezvous.records.encode_verdict`);
    `log` is a path on `host`, `node` the agent that wrote it.
    """

    host: str
    node: str
    rank: int
    local_rank: int
    returncode: int  # negative: killed by that signal
    round: int
    error: str = ""  # the first line of the error file's message
    log: str = ""  # where the full log (or the error file) is, on `host`
    code: int = 0  # the job's exit code as the closing node chose it (exitcodes.py); 0: the root cause's own

    def describe(self) -> str:
        how = Exit(self.returncode).describe()
        return f"rank {self.rank} (local rank {self.local_rank}) on {self.host} {how} (attempt {self.round})"


@dataclass(frozen=True)
class RunResult:
    """What the supervisor hands back: final state, failures, restarts used, exit code."""

    state: GroupState
    exit_code: int
    failures: tuple[Failure, ...] = ()
    restarts: int = 0
    signal: int | None = None
    message: str = ""
    verdict: Verdict | None = None  # the job's root cause as another node published it (None: local or unknown)
    quarantined: tuple[str, ...] = ()  # "host (why)" of each host the job keeps out for now
    round: int | None = None  # the round the group ended in (None: not known)

    @property
    def root_cause(self) -> Failure | None:
        """The earliest failure the launcher did not cause, in the last round that had one."""
        causes = [f for f in self.failures if not f.collateral]
        if not causes:
            return None
        last = max(f.round for f in causes)
        return min((f for f in causes if f.round == last), key=lambda f: f.at)


@dataclass(frozen=True)
class WorkerRow:
    """One worker in the live view."""

    rank: int
    local_rank: int
    pid: int
    state: str
    started: float  # on the supervisor's clock
    last_line: str = ""
    straggler: bool = False


@dataclass
class Snapshot:
    """A read-only picture of the group for views and notifiers."""

    state: GroupState
    round: int = 0
    restarts: int = 0
    workers: list[WorkerRow] = field(default_factory=list)
    signal: int | None = None  # the signal that is stopping (or stopped) the job, if one is
    waiting: str = ""  # while a round forms: what it waits for


class NumaMode(enum.Enum):
    """`--numa_binding MODE`: torchrun's four ways to bind a worker to the CPUs near its GPU."""

    NODE = "node"
    SOCKET = "socket"
    EXCLUSIVE = "exclusive"
    CORE_COMPLEX = "core-complex"


# Why these defaults (docs/policy.md): a worker dead within a minute of its start has not got past
# imports, NCCL init and the checkpoint load, so restarting it at once keeps failing the same way;
# a backoff from 1 s doubling to a 60 s cap costs a job that recovers on its second try nothing, and
# a crash loop at most a minute per try. Five failures in a row that never pass the job's best step
# is about 5 checkpoint intervals lost: past that, a person should look. Three failures of one node
# in its last five rounds is no longer bad luck, and an hour of cooldown outlasts a Slurm requeue.
QUICK = 60.0
BACKOFF = 1.0
BACKOFF_MAX = 60.0
NO_PROGRESS = 5
QUARANTINE_AFTER = 3
QUARANTINE_WINDOW = 5
QUARANTINE_COOLDOWN = 3600.0


@dataclass(frozen=True)
class RestartPolicy:
    """`--restart_policy K=V,...` (and `--quarantine K=V,...`), parsed once."""

    quick: float = QUICK  # a round that failed within this many seconds of its start failed quickly
    backoff: float = BACKOFF  # the wait before the 2nd quick failure's restart; doubles per quick failure
    backoff_max: float = BACKOFF_MAX  # ... up to this
    no_progress: int = NO_PROGRESS  # stop after this many failed rounds in a row below the best step (0: off)
    deterministic: bool = True  # stop when a rank fails twice with the same error at the same step
    quarantine_after: int = QUARANTINE_AFTER  # k: this node's workers failed in k ...
    quarantine_window: int = QUARANTINE_WINDOW  # ... of its last rounds (0: never quarantined for failures)
    quarantine_cooldown: float = QUARANTINE_COOLDOWN  # seconds a quarantined host is kept out of the job
