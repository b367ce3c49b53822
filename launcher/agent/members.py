"""A worker of the current round, its live process, and what it tells: where its output goes, how
long it has been silent, its last step and step rate, its row in the views, its failure; and the
round it ended in, as the restart policy reads it."""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config import LaunchConfig
from ..policy.governor import Ended
from ..spec import Exit, Failure, Round, Verdict, Worker, WorkerRow, WorkerState
from ..telemetry.reports import WorkerReport
from ..telemetry.stragglers import Flagged
from ..telemetry.summary import read_error_file
from . import process
from .env import WorkerSpec, worker_env, workers_of
from .logs import Console, LogRouter, Routing, Stream
from .logs_specs import Placement, PluginLogs, RankLogs, default_placement
from .oom import oom_reason
from .quick_exit import RETURNED_SUFFIX  # not zygote.messages: a launch without --preload never loads it

LAST_LINE_WAIT = 1.0  # seconds a failed round's root cause's stderr is given to reach its end
RATE_WINDOW = 10.0  # seconds of step samples a step rate is measured over
# Seconds a forked worker whose code returned 0 may stay silent in its exit once every other rank of
# its node exited 0; then it is ended and counted a success (see `end_stuck_exits`).
EXIT_GRACE = 10.0

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Member:
    """A worker of the current round and its live process."""

    worker: Worker
    proc: process.WorkerProcess
    streams: list[Stream]
    error_file: str
    log_files: tuple[str, ...]
    started: float = 0.0
    progress_file: str | None = None
    hung: bool = False  # declared hung by --hang_timeout: a failure, not collateral
    stopped: bool = False  # ... and found stopped then (SIGSTOP, a debugger): killed, no stacks dumped
    expired: str = ""  # the scope of its file-timer watchdog that ran out (TORCHELASTIC_ENABLE_FILE_TIMER)
    state: WorkerState = WorkerState.RUNNING
    signalled: bool = False  # the launcher asked it to stop: its failure is collateral
    steps: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))  # (time, step) samples
    straggler: bool = False  # flagged by --straggler_threshold (shown, never acted on)
    ended_in_exit: bool = False  # its code returned 0 and it was ended, stuck in its exit: a success

    def returned(self) -> int | None:
        """The exit code the worker said its code returned with (None: still running, or a plain `python`)."""
        if not self.progress_file:
            return None
        try:
            with open(self.progress_file + RETURNED_SUFFIX) as f:
                return int(f.read().strip() or "1")
        except (OSError, ValueError):
            return None

    @property
    def last_line(self) -> str:
        """The last line it printed, on either stream."""
        return max(self.streams, key=lambda s: s.last_at).last_line if self.streams else ""

    def last_error_line(self, wait: float = 0.0) -> str:
        """The last line it printed on stderr (its error, as a rule): what the restart policy compares.
        `wait`: up to so many seconds for the pump to reach the pipe's end (the process is gone, its last
        lines may not be read yet); a descendant that holds the pipe open only makes it wait that long."""
        err = next((s for s in self.streams if s.name == "stderr"), None)
        if err is None:
            return ""
        err.done.wait(wait)
        return err.last_line

    def stepped(self) -> bool:
        """Whether the worker called launcher.progress() yet."""
        return bool(self.progress_file and os.path.exists(self.progress_file))

    def heard(self, steps_known: bool = False) -> bool:
        """Whether the worker is past its start-up: it called launcher.progress(), or printed a line where
        the job's workers are not known to call it (`steps_known`: one of this node's did, in any
        round). A script that reports steps prints before its first one, then waits in its first
        collective for its slowest peer (a spare's workers importing torch on a busy host): start-up."""
        return self.stepped() or (not steps_known and any(s.last_at for s in self.streams))

    def idle(self, now: float) -> float:
        """Seconds since the worker last printed a line or called launcher.progress()."""
        idle = now - max([self.started] + [s.last_at for s in self.streams if s.last_at])
        try:
            idle = min(idle, time.time() - os.stat(self.progress_file).st_mtime)  # type: ignore[arg-type]
        except (OSError, TypeError):
            pass
        return max(0.0, idle)

    def step_rate(self, now: float) -> tuple[int | None, float | None]:
        """The worker's last `launcher.progress(step=)` and its steps per second over RATE_WINDOW (None: unknown)."""
        step = last_step(self.progress_file)
        if step is None:
            return None, None
        self.steps.append((now, step))
        while len(self.steps) > 2 and now - self.steps[1][0] >= RATE_WINDOW:
            self.steps.popleft()
        then, first = self.steps[0]
        return step, (round((step - first) / (now - then), 3) if now - then >= 1.0 else None)

    def failure(
        self, ex: Exit, at: float, host: str, rnd: Round | None, hang: float | None, ooms: int | None
    ) -> Failure:
        """What its exit `ex` was, with what the launcher knows beyond it (hung, killed by the OOM killer)."""
        if self.hung and self.stopped:
            reason = f"hung: no progress for {hang:g} s, stopped (SIGSTOP or a debugger); killed, no stacks"
        elif self.hung:
            reason = f"hung: no progress for {hang:g} s; stacks in its stderr"
        elif self.expired:
            reason = f"was ended by its watchdog: timer {self.expired!r} expired (TORCHELASTIC_ENABLE_FILE_TIMER)"
        elif ex.signal == signal.SIGKILL and not self.signalled:
            reason = oom_reason(self.proc.pid, ooms, self.started)
        else:
            reason = ""
        return Failure(
            worker=self.worker,
            pid=self.proc.pid,
            exit=ex,
            at=at,
            host=host,
            round=rnd.round if rnd else 0,
            collateral=self.signalled and not self.hung,
            reason=reason,
            error_file=self.error_file if os.path.exists(self.error_file) else None,
            log_files=self.log_files,
            step=last_step(self.progress_file),
        )

    def view(self) -> WorkerRow:
        """Its row in the live view."""
        w = self.worker
        return WorkerRow(
            w.rank, w.local_rank, self.proc.pid, self.state.value, self.started, self.last_line, self.straggler
        )

    def report(self, restarts: int, now: float) -> WorkerReport:
        """Its row in `launcher status`, on the job board."""
        step, rate = self.step_rate(now)
        return WorkerReport(
            rank=self.worker.rank,
            local_rank=self.worker.local_rank,
            pid=self.proc.pid,
            state=self.state.value,
            restarts=restarts,
            progress_age=round(self.idle(now), 1),
            step=step,
            rate=rate,
            straggler=self.straggler,
        )


def kill_stopped(live: Sequence[Member], below: Sequence = ()) -> None:
    """SIGKILL at once each of the `live` workers that is stopped, and each process of `below` (psutil
    handles: what else a stop of the group signals) that is; one line for each."""
    # A stopped process (SIGSTOP, SIGTSTP; a debugger's hold) acts on no signal but SIGKILL: SIGTERM stays
    # pending until a SIGCONT delivers it, so the worker would wait out the whole grace. SIGCONT is not
    # ours to send: it resumes what whoever stopped it wanted held, and a tracer's hold ignores it. Stopped,
    # it flushes and saves nothing anyway: the grace is of no use to it. SIGKILL needs no SIGCONT: the
    # kernel wakes a stopped or traced process to die. (A py-spy dump stops its target for milliseconds:
    # caught in that instant, a worker loses its grace.)
    for m in live:
        if m.proc.stopped():
            log.info(f"rank {m.worker.rank} (pid {m.proc.pid}) is stopped (SIGSTOP or a debugger): killing it now")
            m.proc.send(signal.SIGKILL)
    ours = {m.proc.pid for m in live}
    for p in process.stopped(p for p in below if p.pid not in ours):
        log.info(f"pid {p.pid}, below a worker, is stopped (SIGSTOP or a debugger): killing it now")
        process.kill_procs([p], signal.SIGKILL)


def end_stuck_exits(members: Sequence[Member], now: float, emit) -> None:
    """A worker whose code has returned never holds the job.

    A forked worker says when its code returned, and with what code. Once every rank of this node has
    exited 0 or returned 0, one still in its exit (a non-daemon thread, an atexit handler, a native
    library's teardown) that has printed nothing and called no `progress()` for EXIT_GRACE seconds is
    ended with SIGKILL and counted a success, with one line saying so. A spawned worker runs plain
    `python`, which tells nothing: it is waited for, as torchrun does.
    """
    live = [m for m in members if m.state is WorkerState.RUNNING]
    if not live or any(m.returned() != 0 for m in live):
        return
    if any(m.state is not WorkerState.SUCCEEDED for m in members if m not in live):
        return
    for m in live:
        quiet = m.idle(now)
        try:  # the marker's age: its exit began when its code returned
            quiet = min(quiet, time.time() - os.stat(m.progress_file + RETURNED_SUFFIX).st_mtime)  # type: ignore[operator]
        except (OSError, TypeError):
            pass
        if quiet < EXIT_GRACE or m.ended_in_exit:
            continue
        m.ended_in_exit = True
        log.warning(
            f"rank {m.worker.rank}'s code returned 0 and every other rank exited 0, but it has not exited in "
            f"{quiet:.0f} s (stuck in its teardown); ending it and counting it a success"
        )
        emit("stuck_exit", rank=m.worker.rank, pid=m.proc.pid, quiet=round(quiet, 3))
        m.proc.signal_group(signal.SIGKILL)


def mark_stragglers(members: Sequence[Member], event: Flagged, host: str, c: LaunchConfig, emit) -> None:
    """Mark the `members` the job's judge flagged (or cleared): one line and one event each."""
    for m in members:
        slow = m.worker.rank in event.ranks
        if slow == m.straggler or m.state is not WorkerState.RUNNING:
            continue
        m.straggler = slow
        # The event goes on file before the line is said: whoever reads the line finds the event.
        if slow:
            rate = event.ranks[m.worker.rank]
            emit("straggler", rank=m.worker.rank, rate=rate, median=event.median)
            log.warning(
                f"rank {m.worker.rank} on {host} is a straggler: {rate:.2f} steps/s, "
                f"below {c.straggler_threshold:g} of the job's median {event.median:.2f} "
                f"for {c.straggler_period:g} s (--straggler_threshold)"
            )
        else:
            emit("straggler_cleared", rank=m.worker.rank)
            log.info(f"rank {m.worker.rank} on {host} caught up with the job's median step rate")


def route(
    proc: process.WorkerProcess,
    logs: LogRouter,
    console: Console,
    prefix: str,
    dest: RankLogs,
    rank: int,
    duplicate: Mapping[str, tuple[str | None, tuple[str, ...]]] | None = None,
) -> tuple[list[Stream], tuple[str, ...]]:
    """Hand the worker's pipes (global `rank`) to the log pump: to the console and/or the files `dest`
    names (logs_specs: ours or a --logs_specs plugin's); `duplicate[stream]` is (filtered file, needles)
    for --duplicate_std*_filters. Returns the streams and the log files."""
    streams, files = [], []
    for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        if pipe is None:
            continue
        to_console = dest.stdout_console if name == "stdout" else dest.stderr_console
        path = dest.stdout if name == "stdout" else dest.stderr
        filtered, needles = (duplicate or {}).get(name, (None, ()))
        out = console.stream(name) if to_console else None
        kept = dest.traceback if name == "stderr" else None
        streams.append(
            logs.add(pipe, prefix, out, path, rank=rank, filtered=filtered, needles=needles, name=name, keep=kept)
        )
        files += [path] if path else []
    return streams, tuple(files)


def verdict_of(root: Failure) -> Verdict:
    """A root cause as the rendezvous publishes it, should this node close the job."""
    message = root.reason or read_error_file(root.error_file)[0]
    return Verdict(
        host=root.host,
        node="",
        rank=root.worker.rank,
        local_rank=root.worker.local_rank,
        returncode=root.exit.returncode,
        round=root.round,
        error=(message.splitlines() or [""])[0],
        log=next(iter(root.log_files), root.error_file or ""),
    )


def last_step(progress_file: str | None) -> int | None:
    """A worker's last `launcher.progress(step=)`, or None."""
    if not progress_file:
        return None
    try:
        with open(progress_file, "rb") as f:
            return int(f.read(64).strip() or b"x")
    except (OSError, ValueError):
        return None


def ended_round(
    members: Sequence[Member], failures: Sequence[Failure], rnd: int, failed: bool, stopped_at: float
) -> Ended:
    """Round `rnd` as it ended on this node (its stop begun at `stopped_at`), as the restart policy reads it."""
    cause = min((f for f in failures if not f.collateral and f.round == rnd), key=lambda f: f.at, default=None)
    member = next((m for m in members if cause and m.proc.pid == cause.pid), None)
    return Ended(
        ran=stopped_at - min((m.started for m in members), default=stopped_at),
        failed=failed,
        steps=[last_step(m.progress_file) for m in members],
        cause=cause,
        last_line=member.last_error_line(wait=LAST_LINE_WAIT) if member else "",
    )


def worker_spec(config: LaunchConfig) -> WorkerSpec:
    """What this agent's workers share, from the config."""
    c = config
    return WorkerSpec(
        c.program,
        c.script_args,
        c.local_rank_arg,
        c.role,
        c.max_restarts,
        c.signals_to_handle,
        c.gpus,
        c.virtual_local_rank,
        c.hang_timeout,
    )


def routing_of(config: LaunchConfig) -> Routing:
    """Where the workers' streams go, from the config."""
    c = config
    return Routing(c.redirects, c.tee, c.local_ranks_filter, c.log_dir, c.role, c.multi_node)


def prepare(
    spec: WorkerSpec,
    routing: Routing,
    rnd: Round,
    nproc: int,
    environ: Mapping[str, str],
    attempt: str,
    agent_id: str,
    logs: LogRouter,
    plugin: PluginLogs | None,
) -> tuple[list[Worker], dict[int, dict[str, str]], Placement]:
    """This node's workers in round `rnd`, each one's environment, and where their files go
    (`attempt`: the round's folder; a `--logs_specs` plugin places the files where one is named)."""
    workers = workers_of(rnd, nproc)
    envs = {}
    for worker in workers:
        folder = os.path.join(attempt, str(worker.local_rank))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:  # a full or read-only disk must not stop the job: no files this attempt
            logs.disk_error(folder, e)
        envs[worker.local_rank] = worker_env(
            spec,
            rnd,
            worker,
            environ,
            error_file=os.path.join(folder, "error.json"),
            agent_id=agent_id,
            progress_file=os.path.join(folder, "progress"),
        )
    plan = plugin.place(envs) if plugin else default_placement(routing, attempt, envs)
    return workers, envs, plan
