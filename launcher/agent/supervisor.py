"""The supervisor: one loop that owns the worker group and every decision about it.

Signal handlers, the log pump and rendezvous threads only `post()` events; worker exits wake
the loop through pidfds. The group moves through `GroupState` as a unit:

    RENDEZVOUS -> RUNNING -> SUCCEEDED
                     |
                     +-> STOPPING -> RENDEZVOUS (restart or membership change)
                                  -> FAILED     (budget spent, signal, rendezvous error)
"""

from __future__ import annotations

import logging
import os
import queue
import selectors
import signal
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import replace

from ..config import LaunchConfig
from ..errors import RendezvousClosedError, RendezvousError
from ..exitcodes import ExitCode, for_signal, passed_through
from ..policy.governor import Governor
from ..policy.restart import Stop, requeue_after
from ..rendezvous.api import Cause, MembershipChanged, RendezvousHandler, SpareLost, WaitKind, WaitReport
from ..spec import TRANSITIONS, Failure, GroupState, Round, RunResult, Snapshot, Verdict, Worker, WorkerState
from ..telemetry.reports import NodeReport
from ..telemetry.stragglers import Flagged
from . import process
from .awake import AwakeClock
from .bootstrap import BootstrapStore
from .env import PROGRESS_VAR, worker_argv
from .filetimer import FILE_VAR, end_expired
from .logs_specs import Placement
from .loop_events import Refused, RoundFailed, RoundReady, Stopping, Then, Waiting
from .members import (
    Member,
    end_stuck_exits,
    ended_round,
    kill_stopped,
    mark_stragglers,
    prepare,
    route,
    routing_of,
    verdict_of,
    worker_spec,
)
from .oom import oom_kills
from .parts import Identity, Launching, Observers, in_place
from .signals import SignalReceived, capture_signals

log = logging.getLogger(__name__)


class Supervisor:
    """Run the worker group of one node until it succeeds, fails for good, or is signalled."""

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        launching: Launching,
        *,
        identity: Identity | None = None,
        observers: Observers | None = None,
        governor: Governor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.rendezvous = rendezvous
        self.launching = launching
        self.identity = identity or Identity.of()
        self.observers = observers or Observers()
        self.clock = clock
        self.governor = governor or Governor(
            config.restart_policy, self.identity.host, self.identity.agent_id, multi_node=config.multi_node
        )
        self.stopped_by: Stop | None = None  # the restart policy ended the job (docs/policy.md)
        self.closing: Verdict | None = None  # ... and this is the job's verdict, for every node
        self.requeue = False  # the rendezvous ended the job in a way a requeue may cure
        self._peer_failed = False  # the round ends for a worker that failed on another node
        self._delay = 0.0  # the backoff before the next round's workers start
        self.held: tuple[Round, float] | None = None  # a round formed (joined), its workers to start at that time
        self.spec = worker_spec(config)
        self.routing = routing_of(config)
        self.state = GroupState.RENDEZVOUS
        self.round: Round | None = None
        self.members: list[Member] = []
        self.failures: list[Failure] = []
        self.stop: Stopping | None = None
        self.exit_signal: int | None = None
        self.message = ""
        self._oom_kills: int | None = None
        self.awake = AwakeClock(config.monitor_interval)  # a stall of the agent is no worker's silence
        # MASTER_ADDR:MASTER_PORT, when this node is group rank 0
        self.bootstrap = BootstrapStore(self.launching.environ)
        self.verdict: Verdict | None = None  # the job's root cause as the node that closed the job published it
        self.waiting = ""  # what the forming round waits for, while in RENDEZVOUS
        self.wait_kind: WaitKind | None = None  # what kind of wait that is (a spare, a replacement...)
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self.in_place = in_place(self, config, self.launching.environ)  # --recovery in-place: a worker replaced alone
        self._steps_known = False  # a worker of this node called launcher.progress(), in any round (check_hangs)

    # ------------------------------------------------------------------ the loop

    def post(self, event: object) -> None:
        """Hand an event to the loop; safe from signal handlers and other threads."""
        self._events.put(event)
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full, so the loop is awake already

    def capture_signals(self):
        """While inside, the handled signals become events for this loop (see `run`)."""
        handled = self.config.signals_to_handle + self.config.passthrough_signals
        return capture_signals(handled, self.post, self._wake_w)

    def run(self) -> RunResult:
        """Rendezvous, spawn, supervise, restart; return when the group is done for good. Call it inside
        `capture_signals()`, kept open until the launcher exits: a signal during the last lines is a no-op."""
        self.begin_round(Cause.START)
        try:
            while self.state not in (GroupState.SUCCEEDED, GroupState.FAILED):
                self.step()
        finally:
            self.bootstrap.close()
        return self.result()

    def step(self, timeout: float | None = None) -> None:
        """Wait for one batch of events (or the next deadline), then act on everything seen."""
        if timeout is None:
            timeout = self.config.monitor_interval
            if self.stop:
                timeout = min(timeout, max(0.0, self.stop.deadline - self.clock()))
            if self.held and self.state is GroupState.RENDEZVOUS:
                timeout = min(timeout, max(0.0, self.held[1] - self.clock()))
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            self.handle(event)
        if self.held and self.state is GroupState.RENDEZVOUS and self.clock() >= self.held[1]:
            rnd, self.held = self.held[0], None
            self.spawn_workers(rnd, watched=True)
        self.reap_workers()
        self.check_stop()
        self.check_hangs()
        end_stuck_exits(self.members if self.state is GroupState.RUNNING else (), self.clock(), self.emit)
        if self.observers.watchdog:
            end_expired(self.observers.watchdog, self.members, self.emit)
        for check in self.observers.periodic:
            check()

    def handle(self, event: object) -> None:
        if isinstance(event, SignalReceived):
            self.handle_signal(event.signum)
        elif isinstance(event, RoundReady) and self.state is GroupState.RENDEZVOUS:
            self.hold(event.rnd) if self._delay else self.spawn_workers(event.rnd)
        elif isinstance(event, RoundFailed) and self.state is GroupState.RENDEZVOUS:
            closed = event.error if isinstance(event.error, RendezvousClosedError) else None
            if closed is not None and closed.succeeded:  # a spare (or a late node) of a job that finished well
                who = "spare" if self.wait_kind is WaitKind.SPARE else "node"
                log.info(f"{closed}; the job finished without this {who}")
                return self._set_state(GroupState.SUCCEEDED)
            self.message = str(event.error)
            if closed is not None and isinstance(closed.verdict, Verdict):
                self.verdict = closed.verdict
            self.requeue = requeue_after(event.error, self.round is not None, self.config.max_restarts)
            self._set_state(GroupState.FAILED)
        elif isinstance(event, Refused) and self.state is GroupState.RENDEZVOUS:
            self.give_up(Stop.QUARANTINE, event.why)
        elif isinstance(event, MembershipChanged) and self.held and self.state is not GroupState.RUNNING:
            self.held = None  # the held round ended before its workers started: join the next one
            if self.state is GroupState.RENDEZVOUS:
                self.begin_round(Cause.MEMBERSHIP)  # (while STOPPING, `check_stop` asks for it)
        elif isinstance(event, Waiting) and self.state is GroupState.RENDEZVOUS:
            self.waiting = event.line
            if event.kind is not self.wait_kind:  # the events file hears of each new kind of wait once
                self.wait_kind = event.kind
                self.emit("waiting", what=event.kind.value, line=event.line)
        elif isinstance(event, SpareLost):
            self.emit("spare_lost", node=event.node)
        elif isinstance(event, Flagged):
            self.flag_stragglers(event)
        elif self.in_place and self.in_place.owns(event) and self.state is GroupState.RUNNING:
            self.in_place.on(event)
        elif isinstance(event, MembershipChanged) and self.state is GroupState.RUNNING:
            if self.in_place and self.in_place.follow(event):
                return
            if event.closed:
                log.info(f"the job was closed ({event.reason}); stopping the workers")
            elif event.failed:
                self.launching.logs.failed_first(-1, f"a worker failed on another node ({event.reason})")
                log.info(f"a worker failed on another node: {event.reason}; restarting the group")
            else:
                log.info(f"membership changed ({event.reason}); re-forming the job")
            self.emit("membership", reason=event.reason)
            why = "closed" if event.closed else None  # the job ends: no new round will come
            self._peer_failed = event.failed
            self.stop_workers(signal.SIGTERM, self.config.shutdown_timeout, then=Then.MEMBERSHIP, reason=why)

    # ------------------------------------------------------------------ verbs

    def begin_round(self, cause: Cause, verdict: Verdict | None = None) -> None:
        """Ask the rendezvous for the next round on a helper thread; the answer comes as an event."""
        self._set_state(GroupState.RENDEZVOUS)
        self.emit("rendezvous", cause=cause.value)
        previous = [m.proc.pid for m in self.members]

        def ask() -> None:
            refused = self.governor.admit(previous)  # the health gate and the quarantine records
            if refused:
                return self.post(Refused(refused))
            try:
                told: Callable[[WaitReport], None] = lambda w: self.post(Waiting(w.line, w.kind))  # noqa: E731
                self.post(RoundReady(self.rendezvous.next_round(cause, verdict, told)))
            except RendezvousError as e:
                self.post(RoundFailed(e))
            except Exception as e:  # a backend bug must end the job with a message, never hang it
                self.post(RoundFailed(RendezvousError(f"rendezvous failed unexpectedly: {type(e).__name__}: {e}")))

        threading.Thread(target=ask, name="launcher-rendezvous", daemon=True).start()

    def hold(self, rnd: Round) -> None:
        """Backoff: take the formed round (heartbeating), start its workers `_delay` s from now."""
        delay, self._delay = self._delay, 0.0
        self.watch_round(rnd)
        self.held = (rnd, self.clock() + delay)
        self.waiting = f"backoff: restarting in {delay:g} s"
        streak = self.governor.history.quick_streak
        log.info(f"restarting in {delay:g} s: {streak} quick failures in a row (--restart_policy backoff)")
        self.emit("backoff", delay=delay, quick_failures=streak)

    def give_up(self, why: Stop, line: str) -> None:
        """The restart policy stops the job on this node: one line, one event, FAILED with its code."""
        self.stopped_by, self.message = why, why.message(self.governor.host, line)
        log.error(self.message + why.advice)
        if why is not Stop.QUARANTINE:  # the job ends on every node, with this verdict (run.py)
            root = self.root_verdict()
            self.closing = replace(root, code=why.exit_code) if root else None
        self.emit("policy_stop", stop=why.value, reason=line, host=self.governor.host)
        self._set_state(GroupState.FAILED)

    def spawn_workers(self, rnd: Round, watched: bool = False) -> None:
        self.emit("starting", round=rnd.round, restarts=rnd.restart_count)  # formed: start-up (or restart) from here
        rnd, problem = self.bootstrap.open(rnd)
        if problem:
            log.warning(problem)
        previous, self.round, self.waiting, self.wait_kind = self.round, rnd, "", None
        if previous is not None:
            why = "restart" if rnd.restart_count > previous.restart_count else "membership change"
            n = self.config.nproc_per_node
            log.info(
                f"round {rnd.round} ({why}; {rnd.restart_count} of {self.config.max_restarts} restarts used): "
                f"starting {n} worker{'' if n == 1 else 's'}, world size {rnd.world_size}"
            )
        # Heartbeat from now on: starting the workers may wait (the zygote's imports), and peers must
        # not take this node for dead meanwhile. What the watch posts waits in the queue until RUNNING.
        if not watched:
            self.watch_round(rnd)
        self._peer_failed = False
        self._oom_kills = oom_kills()  # a rise by a worker's SIGKILL means the kernel's OOM killer
        if self.observers.watchdog:
            self.observers.watchdog.forget(m.proc.pid for m in self.members)
        self.members = []
        self.launching.logs.new_round()
        if not self.start_ranks(rnd):
            return
        self._set_state(GroupState.RUNNING)
        self.announce_running(rnd)

    def prepare_round(self, rnd: Round) -> tuple[list[Worker], dict[int, dict[str, str]], Placement]:
        """Round `rnd`'s workers, their environments, and where their output goes (attempt_<round>/)."""
        out = self.launching
        attempt = os.path.join(out.run_dir, f"attempt_{rnd.round}")
        n, agent = self.config.nproc_per_node, self.identity.agent_id
        return prepare(self.spec, self.routing, rnd, n, out.environ, attempt, agent, out.logs, out.logs_plugin)

    def start_ranks(self, rnd: Round, ranks: Collection[int] | None = None) -> bool:
        """Start this node's workers of round `rnd` (those of `ranks` alone, where given); False: one could not."""
        workers, envs, plan = self.prepare_round(rnd)
        chosen = [w for w in workers if ranks is None or w.rank in ranks]
        return all(self.start_member(w, envs[w.local_rank], plan, rnd.round) for w in chosen)

    def announce_running(self, rnd: Round, **extra: object) -> None:
        """The `running` event: every worker of round `rnd` this node starts has started."""
        self.emit(
            "running",
            round=rnd.round,
            restarts=rnd.restart_count,
            workers=len(self.members),
            group_rank=rnd.group_rank,
            group_world_size=rnd.group_world_size,
            world_size=rnd.world_size,
            **extra,
        )

    def start_member(self, worker: Worker, env: dict[str, str], plan: Placement, rnd: int) -> bool:
        """Start one worker of round `rnd` and watch it; False: it could not start (the job ends)."""
        dest, c = plan.ranks[worker.local_rank], self.config
        if self.observers.watchdog:  # where FileTimerClient writes, as torch's agent tells its workers
            env[FILE_VAR] = self.observers.watchdog.path
        argv = worker_argv(self.spec, worker)
        try:
            proc = process.start_retrying(self.launching.starter, argv, env, self.clock)
        except OSError as e:  # e.g. a --no_python command removed since the last round
            self._spawn_failed(argv[0], e)
            return False
        if self.launching.guard:
            self.launching.guard.watch(proc.pid)
        if proc.pidfd is not None:
            self._selector.register(proc.pidfd, selectors.EVENT_READ, proc)
        prefix = self.routing.prefix(worker, self.identity.host, self.launching.environ)
        # torch duplicates the tee'd streams' matching lines only
        pairs = {"stdout": (plan.filtered_stdout, c.stdout_filters), "stderr": (plan.filtered_stderr, c.stderr_filters)}
        duplicate = {n: (f if c.tee.has(worker.local_rank, n) else None, needles) for n, (f, needles) in pairs.items()}
        streams, files = route(proc, self.launching.logs, self.launching.console, prefix, dest, worker.rank, duplicate)
        self.members.append(Member(worker, proc, streams, dest.error_file, files, self.clock(), env[PROGRESS_VAR]))
        self.emit("spawn", rank=worker.rank, local_rank=worker.local_rank, pid=proc.pid, round=rnd, forked=proc.forked)
        return True

    def _spawn_failed(self, program: str, error: OSError) -> None:
        """A worker that cannot be started ends the job with that reason; restarting cannot help."""
        self.message = f"cannot start {program}: {error.strerror or error}"
        log.error(self.message)
        if not self.members:
            return self._set_state(GroupState.FAILED)
        self._set_state(GroupState.RUNNING)
        self.stop_workers(signal.SIGTERM, self.config.shutdown_timeout, then=Then.FAIL)

    def reap_workers(self) -> None:
        """Collect every worker that ended, and decide what its exit means for the group."""
        for m in self.members:
            if m.state is not WorkerState.RUNNING:
                continue
            ex = m.proc.poll()
            if ex is None:
                continue
            self._forget(m.proc)
            self.emit(
                "exit",
                rank=m.worker.rank,
                pid=m.proc.pid,
                returncode=ex.returncode,
                how=ex.describe(),
                collateral=m.signalled,
            )
            if ex.ok or m.ended_in_exit:
                m.state = WorkerState.SUCCEEDED
            else:
                m.state = WorkerState.STOPPED if m.signalled and not m.hung else WorkerState.FAILED
                hang = self.config.hang_timeout
                self.failures.append(m.failure(ex, self.clock(), self.identity.host, self.round, hang, self._oom_kills))
        if self.state is not GroupState.RUNNING:
            return
        if any(m.state is WorkerState.FAILED for m in self.members):
            failed = [m for m in self.members if m.state is WorkerState.FAILED]
            said = self.in_place.recover(failed) if self.in_place else ""
            if said is None:  # replaced in place, lost after the job's end, or restarted free of charge
                return
            ours = [f for f in self.failures if not f.collateral and f.round == self.round.round]
            cause = min(ours, key=lambda f: f.at)
            what = cause.reason or cause.exit.describe()
            self.launching.logs.failed_first(cause.worker.rank, what)  # the others' tracebacks: collateral
            log.info(said or f"rank {cause.worker.rank} {what}; stopping the group")
            # The rendezvous still hears of the failure (it closes the job with its root cause), but
            # with the budget spent the events file says the stop ends the job, not that it restarts.
            spent = self.round is not None and self.round.restart_count >= self.config.max_restarts
            why = Then.FAIL.value if spent else None
            self.stop_workers(signal.SIGTERM, self.config.shutdown_timeout, then=Then.RESTART, reason=why)
        elif all(m.state is WorkerState.SUCCEEDED for m in self.members):
            if self.in_place:  # a recovery the workers finished after, before its wait was heard here
                self.in_place.at_end()
            self.sweep(graceful=True)
            self._set_state(GroupState.SUCCEEDED)

    def stop_workers(self, signum: int, grace: float, then: Then, reason: str | None = None) -> None:
        """Send `signum` to every live worker tree; SIGKILL what is left after `grace` seconds.
        `reason` is the events file's word for the stop when it is not `then`'s (the job ends)."""
        self.stop = Stopping(then, self.clock() + grace, signum, begun=self.clock())
        self._set_state(GroupState.STOPPING)
        self.emit("stopping", reason=reason or then.value, signal=signal.Signals(signum).name, grace=grace)
        self.signal_workers(signum, mark=True)

    def signal_workers(self, signum: int, mark: bool = False) -> None:
        """Forward `signum` to each live worker's process group and to its escaped descendants; what of
        them is stopped gets SIGKILL at once (`members.kill_stopped`)."""
        live, below = [m for m in self.members if m.state is WorkerState.RUNNING], process.descendants(self._not_mine())
        for m in live:
            m.signalled = m.signalled or mark
        kill_stopped(live, below)
        for m in live:
            m.proc.signal_group(signum)
        groups = {m.proc.pid for m in live}
        process.kill_procs([p for p in below if process.pgid(p.pid) not in groups], signum)

    def check_stop(self) -> None:
        """Escalate to SIGKILL at the deadline; once every worker is gone, finish the stop."""
        if self.state is not GroupState.STOPPING or self.stop is None:
            return
        if any(m.state is WorkerState.RUNNING for m in self.members):
            if self.clock() >= self.stop.deadline:
                self.signal_workers(signal.SIGKILL)
            else:  # one stopped during the grace would wait it all out
                kill_stopped([m for m in self.members if m.state is WorkerState.RUNNING])
            return
        self.sweep(graceful=False)
        if self.held is None:  # a round joined already keeps the store the other nodes' workers are in
            self.bootstrap.close()  # before the next round: no worker may meet this round's keys
        (then, begun), self.stop = (self.stop.then, self.stop.begun), None
        if then in (Then.RESTART, Then.MEMBERSHIP):
            rnd = self.round.round if self.round else 0
            ended = ended_round(self.members, self.failures, rnd, then is Then.RESTART or self._peer_failed, begun)
            decision = self.governor.round_ended(ended)
            self._delay = decision.delay
            if then is Then.RESTART and decision.stop:  # only the node whose worker failed acts on a stop
                if decision.stop is Stop.QUARANTINE:
                    self.governor.quarantine(decision.why)
                return self.give_up(decision.stop, decision.why)
        if self.held is not None and then is Then.MEMBERSHIP:  # joined already (recovery.py): its workers start now
            self.held, self._delay = (self.held[0], self.clock() + self._delay), 0.0
            self._set_state(GroupState.RENDEZVOUS)
        elif then is Then.RESTART:
            self.begin_round(Cause.FAILURE, self.root_verdict())
        elif then is Then.MEMBERSHIP:
            self.begin_round(Cause.MEMBERSHIP)
        else:
            self._set_state(GroupState.FAILED)

    def flag_stragglers(self, event: Flagged) -> None:
        """Mark this node's ranks the job's judge flagged (or cleared): one line and one event each."""
        mark_stragglers(self.members, event, self.identity.host, self.config, self.emit)

    def check_hangs(self) -> None:
        """--hang_timeout: a worker with no output and no progress() call for that long, of the time
        this agent ran, is hung (a node stopped whole is not: `awake.py`); before its first line or
        call, it is starting (imports on a busy host take seconds), judged by --hang_startup_timeout.

        SIGABRT makes faulthandler (PYTHONFAULTHANDLER=1) dump every thread's stack to the worker's
        stderr before it dies, so the log shows where it was stuck; the group then restarts.
        """
        limit, now = self.config.hang_timeout, self.clock()
        self.awake.tick(now)
        if not limit or self.state is not GroupState.RUNNING:
            return
        for m in self.members:
            if m.state is not WorkerState.RUNNING or m.hung or m.returned() is not None:
                continue  # a worker whose code has returned is exiting, not hung
            idle = self.awake.silence(m.idle(now), now)  # counted while the agent ran (agent/awake.py)
            idle = self.in_place.silence(idle, now) if self.in_place else idle  # not while it recovers
            self._steps_known = self._steps_known or m.stepped()
            if idle is not None and idle > (
                limit if m.heard(self._steps_known) else max(limit, self.config.hang_startup_timeout)
            ):
                m.hung, m.stopped = True, m.proc.stopped()  # stopped, it cannot dump its stacks (kill_stopped)
                then = "it is stopped (SIGSTOP or a debugger): killing it" if m.stopped else "dumping its stacks"
                log.info(f"rank {m.worker.rank} made no progress for {idle:.0f} s (--hang_timeout); {then}")
                self.emit("hang", rank=m.worker.rank, pid=m.proc.pid, idle=round(idle, 3))
                m.proc.send(signal.SIGKILL if m.stopped else signal.SIGABRT)

    def sweep(self, graceful: bool) -> None:
        """Kill whatever the workers left behind (daemons, escaped grandchildren) and reap it."""
        mine = [m.proc.pid for m in self.members] + list(self.launching.starter.helpers())
        process.sweep(self._not_mine(), mine, graceful)

    def handle_signal(self, signum: int) -> None:
        self.emit("signal", name=signal.Signals(signum).name, passthrough=signum in self.config.passthrough_signals)
        if signum in self.config.passthrough_signals:
            log.info(f"passing {signal.Signals(signum).name} to the workers")
            for m in self.members:  # the worker process only: its children may not handle it
                if m.state is WorkerState.RUNNING:
                    m.proc.send(signum)
            return
        first = self.exit_signal is None
        if first:
            self.exit_signal = signum
        if self.state is GroupState.RENDEZVOUS:
            if first:
                name = signal.Signals(signum).name
                log.info(
                    f"got {name} while waiting for the rendezvous to form a round; stopped (no worker was running)"
                )
            self._set_state(GroupState.FAILED)
        elif self.state is GroupState.RUNNING or (self.state is GroupState.STOPPING and first):
            log.info(
                f"got {signal.Signals(signum).name}; stopping the workers (up to {self.config.shutdown_timeout:g} s)"
            )
            self.stop_workers(signum, self.config.shutdown_timeout, then=Then.SIGNAL)
        elif signum == signal.SIGINT and self.stop and self.stop.signum == signal.SIGINT:
            log.info("second SIGINT; killing the workers now")
            self.stop.deadline = self.clock()

    # ------------------------------------------------------------------ results

    def snapshot(self) -> Snapshot:
        """A picture of the group for views; safe to call from another thread."""
        rnd = self.round
        workers = [m.view() for m in list(self.members)]
        waiting = self.waiting if self.state is GroupState.RENDEZVOUS else ""
        return Snapshot(
            self.state,
            rnd.round if rnd else 0,
            rnd.restart_count if rnd else 0,
            workers,
            signal=self.exit_signal,
            waiting=waiting,
        )

    def report(self) -> NodeReport | None:
        """This node as `launcher status` shows it (published by the job board's monitor every few
        seconds, from its thread): the group, and each worker's state, progress and step rate.
        None while the round's workers are still being started."""
        if self.state is GroupState.RENDEZVOUS:
            return None
        rnd = self.round
        restarts = rnd.restart_count if rnd else 0
        now = self.clock()
        workers = [m.report(restarts, now) for m in list(self.members)]
        return NodeReport(
            host=self.identity.host,
            state=self.state.value,
            round=rnd.round if rnd else 0,
            restarts=restarts,
            max_restarts=self.config.max_restarts,
            workers=tuple(workers),
        )

    def result(self) -> RunResult:
        restarts, last = (self.round.restart_count, self.round.round) if self.round else (0, None)
        if self.state is GroupState.SUCCEEDED:
            return RunResult(self.state, ExitCode.OK, tuple(self.failures), restarts, round=last)
        if self.exit_signal is not None:
            code = for_signal(self.exit_signal)
        elif self.stopped_by is not None:
            code = self.stopped_by.exit_code
        elif self.verdict is not None and self.verdict.code:  # the policy of the node that closed the job
            code = self.verdict.code
        elif self.requeue:
            code = ExitCode.REQUEUE
        else:
            root = RunResult(self.state, 0, tuple(self.failures)).root_cause
            code = passed_through(self.verdict.returncode if self.verdict else root.exit.returncode if root else 0)
        failures, known, v = tuple(self.failures), self.governor.known, self.verdict
        return RunResult(self.state, code, failures, restarts, self.exit_signal, self.message, v, known, last)

    # ------------------------------------------------------------------ helpers

    def emit(self, kind: str, **fields: object) -> None:
        """Hand one event to every sink; a failing sink never disturbs supervision."""
        for sink in self.observers.sinks:
            try:
                sink(kind, fields)
            except Exception:
                log.debug("event sink %r failed on %s", sink, kind, exc_info=True)

    def _set_state(self, new: GroupState) -> None:
        if new is not self.state and new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"group cannot go from {self.state.name} to {new.name}")
        self.state = new

    def root_verdict(self) -> Verdict | None:
        """This node's root cause, as the rendezvous publishes it should it close the job."""
        root = RunResult(self.state, 0, tuple(self.failures)).root_cause
        return verdict_of(root) if root else None

    def watch_round(self, rnd: Round) -> None:
        """Heartbeat from now on (the rendezvous), and report this node on the job board."""
        self.rendezvous.watch(rnd, self.post)
        if self.observers.monitor is not None:
            self.observers.monitor.begin(rnd, self.report, self.post)

    def _forget(self, proc: process.WorkerProcess) -> None:
        if proc.pidfd is not None:
            try:
                self._selector.unregister(proc.pidfd)
            except (KeyError, ValueError):
                pass
        proc.close()

    def _not_mine(self) -> list[int]:
        guard = [self.launching.guard.pid] if self.launching.guard and self.launching.guard.pid else []
        return guard + list(self.launching.starter.helpers())  # the zygote is the agent's, not the workers'
