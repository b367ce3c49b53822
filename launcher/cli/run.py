"""The composition root: wire config, rendezvous, logs, sinks and supervisor; return an exit code.

It owns the console: the one `Console` (worker lines, and the live view's redirection of them) and
the handler that prints every module's `logging` records on it (`logs.configure_console`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from contextlib import ExitStack, nullcontext

from ..agent import process, slots
from ..agent.logs import Console, LogRouter, configure_console
from ..agent.members import routing_of
from ..agent.notify import Notifier
from ..agent.parts import Identity, Launching, Observers
from ..agent.supervisor import Supervisor
from ..config import LaunchConfig
from ..errors import EXIT_OK, LauncherError, exit_code_for_signal
from ..policy.governor import governor_for
from ..policy.restart import Stop
from ..rendezvous import create_rendezvous
from ..rendezvous.api import last_will
from ..telemetry.accounting import Accountant, conclude
from ..telemetry.board import Monitor
from ..telemetry.stragglers import Judge
from ..telemetry.summary import copy_root_cause, summary_lines
from ..worker.inplace import keys

log = logging.getLogger(__name__)


def run(config: LaunchConfig) -> int:
    """Run the job on this node; the return value is the launcher's exit code."""
    tty = process.is_tty(sys.stderr)
    console = Console()
    configure_console(console, config.log_level, quiet=config.quiet, timestamps=not tty)
    for note in config.notes:  # what the flags made worth a word: one line each
        log.warning(note)
    agent_id = f"{os.getpid()}-{os.urandom(6).hex()}"
    process.become_subreaper()  # before the guard: the fork inherits ctypes, loaded once
    guard = process.Guard(agent_id).start()  # before any thread exists
    starter = make_starter(config, agent_id)  # a zygote imports torch while the rendezvous runs
    notifier = Notifier()
    watchdog = None
    try:
        logs_plugin = _logs_plugin(config)
        watchdog = _watchdog()
        rendezvous = create_rendezvous(config.rdzv_backend, config.rendezvous, config.job)
        if (will := last_will(rendezvous)) is not None:  # the guard tells the store at once if this agent dies
            guard.will(will.host, will.port, will.payload, will.answer)
    except LauncherError as e:
        if watchdog:
            watchdog.close()
        starter.close()
        guard.stop()
        log.error(f"error: {e}")
        return e.exit_code
    except KeyboardInterrupt:  # Ctrl-C while it connects to the store: one line, not click's empty one
        starter.close()
        guard.stop()
        log.error(
            f"got SIGINT while connecting to the {config.rdzv_backend} rendezvous; stopped (no worker was started)"
        )
        return exit_code_for_signal(signal.SIGINT)
    run_dir, temporary = make_run_dir(config)
    environ = dict(os.environ)  # what the workers inherit
    # Each rank keeps its own state in a folder in memory: its streams (in place), and the copy of what its
    # `Job` keeps, where a restart of the group resumes (worker/inplace/memory.py).
    memory = environ[keys.SLOTS_VAR] = slots.make(config.run_id, run_dir)
    guard.remove(memory)  # should the agent die by SIGKILL
    prewarm = threading.Timer(PREWARM_AFTER, _prewarm)  # a job over by then never pays for it
    prewarm.daemon = True
    prewarm.start()
    with ExitStack() as cleanup:
        if memory:
            cleanup.callback(slots.remove, memory)
        cleanup.callback(prewarm.cancel)
        if watchdog:
            cleanup.callback(watchdog.close)
        sinks: list = [notifier]
        if config.events_on_console:  # --event_log_handler console
            sinks.append(_event_line)
        if config.events_file:
            from ..telemetry.events import EventsFile

            try:
                events = EventsFile(config.events_file)
            except OSError as e:  # like --log_dir: a disk problem never stops the job
                log.warning(
                    f"cannot write --events_file {config.events_file}: {e.strerror or e}; the job goes on without it"
                )
            else:
                cleanup.callback(events.close)
                sinks.append(events)
        logs = LogRouter()
        accountant = Accountant(
            lambda: [(m.worker.rank, m.progress_file) for m in supervisor.members],
            formed=lambda: supervisor.bootstrap.formed_at(),
        )
        sinks.append(accountant)
        published: list = [None]  # the board's last report of this node (the metrics' steps and rates)

        def annotate(report):
            published[0] = report = dataclasses.replace(report, goodput=accountant.breakdown().rounded())
            return report

        monitor = Monitor(
            rendezvous.shared_store(),
            config.run_id,
            Judge(config.straggler_threshold, config.straggler_period),
            annotate=annotate,
        )
        governor = governor_for(config, rendezvous.shared_store(), agent_id, os.environ)
        supervisor = Supervisor(
            config,
            rendezvous,
            Launching(logs, run_dir, starter, environ, console, guard, logs_plugin),
            identity=Identity.of(agent_id),
            observers=Observers(sinks, [notifier.tick, starter.check, accountant.tick], monitor, watchdog),
            governor=governor,
        )
        if config.metrics:
            from ..telemetry.metrics import AgentCollector, serve

            info = {"run_id": config.run_id, "host": supervisor.identity.host, "backend": config.rdzv_backend}
            server = serve(*config.metrics, AgentCollector(supervisor, accountant, lambda: published[0], info))
            if server is not None:
                cleanup.callback(server.close)
        cleanup.enter_context(supervisor.capture_signals())  # until the very end: late signals are no-ops
        live = config.live if config.live is not None else (tty and not config.quiet)
        with _live_view(supervisor, console) if live else nullcontext():
            try:
                result = supervisor.run()
            except BaseException:
                process.kill_marked(agent_id)  # never leave workers behind, whatever went wrong here
                raise
            finally:
                logs.drain([s for m in supervisor.members for s in m.streams], timeout=2.0)
                logs.close()
                starter.close()
                governor.close()
                if memory:  # the workers are gone: before the guard, which removes it should the agent die now
                    slots.remove(memory)
                guard.stop()
        why = f"stopped by {signal.Signals(result.signal).name}" if result.signal else ""
        if supervisor.stopped_by is not None:  # the others learn why this node left (a quarantine)
            why = result.message
        monitor.stop()  # this node's last report, before the store may go with the rendezvous
        if supervisor.closing is not None:  # a deterministic failure or no progress: the job ends everywhere
            rendezvous.close(supervisor.closing, f"{result.message} (exit {result.exit_code}: do not requeue)")
        # Quarantined or stopped by a signal, this node leaves alone as far as it knows; the others re-form
        # without it (a spare takes its place) once it has left, so it does not wait for their figures.
        leaves = "quarantined" if supervisor.stopped_by is Stop.QUARANTINE else why if result.signal else ""
        goodput = ""  # `launcher check`, `launcher bench`: no useful work to measure, no goodput line
        if config.trains:
            goodput = conclude(
                accountant, rendezvous.shared_store(), config.run_id, supervisor.identity.host, supervisor.emit, leaves
            )
        rendezvous.shutdown(result.exit_code == EXIT_OK, why)
        supervisor.emit("finished", state=result.state.value, exit_code=result.exit_code, restarts=result.restarts)
        if result.exit_code == EXIT_OK and result.restarts:
            log.info(f"job succeeded after {result.restarts} restart(s)")
        kept = temporary and (_has_logs(run_dir) or bool(result.failures))
        print_summary(result, rich_ok=tty, kept=run_dir if kept else "")
        problem = copy_root_cause(result, os.environ.get("TORCHELASTIC_ERROR_FILE"))
        if problem:
            log.warning(problem)
        if goodput:
            log.info(goodput)
    if temporary and not kept:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result.exit_code


def make_starter(config: LaunchConfig, agent_id: str) -> process.Starter:
    """Workers spawned fresh, or (--preload) forked from a zygote started now; bound to CPUs by --numa_binding."""
    starter: process.Starter = process.Spawner()
    if config.preload_modules is not None:
        from ..agent.env import zygote_env
        from ..agent.zygote.client import Preloaded

        starter = Preloaded(
            config.program,
            config.module,
            config.preload_modules,
            zygote_env(config.nproc_per_node, os.environ, agent_id=agent_id),
        )
    if config.numa_binding is not None:
        from ..agent.numa import Binding, NumaBound

        binding = Binding.create(config.numa_binding, os.environ, config.gpus)
        if binding is not None:
            starter = NumaBound(starter, binding)
    return starter


def _logs_plugin(config: LaunchConfig):
    """--logs_specs NAME: the torchrun.logs_specs plugin (imports torch); None for our own layout."""
    if config.logs_specs is None:
        return None
    from ..agent.logs_specs import PluginLogs

    log.info(f"log files placed by the torchrun.logs_specs plugin {config.logs_specs!r}")
    return PluginLogs(
        config.logs_specs,
        config.log_dir,
        config.redirects,
        config.tee,
        config.local_ranks_filter,
        config.nproc_per_node,
    )


def _watchdog():
    """torch's file-timer watchdog where TORCHELASTIC_ENABLE_FILE_TIMER=1 (None otherwise)."""
    from ..agent.filetimer import FILE_VAR, from_environ

    try:
        watchdog = from_environ(os.environ)
    except OSError as e:
        raise LauncherError(f"{FILE_VAR}: cannot make the watchdog's named pipe: {e.strerror or e}") from None
    if watchdog:
        log.info(f"file-timer watchdog on {watchdog.path} (TORCHELASTIC_ENABLE_FILE_TIMER=1)")
    return watchdog


def _event_line(kind: str, fields: dict) -> None:
    """One launcher line per event (torch's console event handler logs each event the same way)."""
    log.info("event %s %s", kind, " ".join(f"{k}={v}" for k, v in fields.items()))


class _live_view:
    """Show the live table while the job runs, with worker lines printed above it."""

    def __init__(self, supervisor: Supervisor, console: Console):
        from .view import LiveView

        self.view = LiveView(supervisor.snapshot)
        self.console = console

    def __enter__(self):
        self.saved = self.console.stdout, self.console.stderr
        self.console.stdout = self.console.stderr = self.view.writer()
        self.view.start()
        return self

    def __exit__(self, *exc):
        self.view.stop()
        self.console.stdout, self.console.stderr = self.saved


def print_summary(result, rich_ok: bool, kept: str = "") -> None:
    """The failure summary on stderr: a rich panel on a terminal, plain `launcher:` lines elsewhere;
    `kept` names the temporary folder a failed or interrupted run keeps."""
    lines = summary_lines(result, kept)
    if not lines:
        return
    if not rich_ok:
        log.error("\n".join(lines))
        return
    from .view import print_panel

    print_panel(lines)


def make_run_dir(config: LaunchConfig) -> tuple[str, bool]:
    """`<log_dir>/<run_id>_<random>` (kept), or a temporary folder for error files only.

    A --log_dir that cannot be written (read-only, full, not a folder) never stops the job: the
    logs go to a temporary folder instead, and the launcher says where.
    """
    name = re.sub(r"[^\w.-]", "_", config.run_id)[:64]  # any run id makes a valid folder name
    if config.log_dir and not config.logs_specs:  # a --logs_specs plugin makes its own folders there
        try:
            os.makedirs(config.log_dir, exist_ok=True)
            path = tempfile.mkdtemp(prefix=f"{name}_", dir=config.log_dir)
        except OSError as e:
            log.warning(
                f"cannot write to --log_dir {config.log_dir}: {e.strerror or e}; the job goes on, "
                "with its logs in a temporary folder"
            )
        else:
            log.info(f"logs in {path}")
            return path, False
    try:
        path = tempfile.mkdtemp(prefix=f"launcher-{name}-")
    except OSError as e:  # no writable temporary folder either: every file below fails and says so
        path = os.path.join(tempfile.gettempdir(), f"launcher-{name}-{os.getpid()}")
        log.warning(f"cannot create a folder for logs and error files in {tempfile.gettempdir()}: {e.strerror or e}")
    if config.log_dir or _writes_files(config):
        log.info(f"logs in {path}" + ("" if config.log_dir else " (a temporary folder; --log_dir DIR to choose)"))
    return path, True


def _writes_files(config: LaunchConfig) -> bool:
    """Whether --redirects, --tee or --local_ranks_filter send some worker stream to a file."""
    routing = routing_of(config)
    return any(routing.destinations(r, s)[1] for r in range(config.nproc_per_node) for s in ("stdout", "stderr"))


def _has_logs(run_dir: str) -> bool:
    for _, _, files in os.walk(run_dir):
        if any(f.endswith(".log") for f in files):
            return True
    return False


# seconds: after the workers' start-up, not during it. psutil's import costs ~50 ms of CPU (more on a
# busy host), which eight workers starting on two cores feel; at 0.25 s it landed in their start-up.
PREWARM_AFTER = 1.0


def _prewarm() -> None:
    """Import psutil off the critical path, once the workers have started; the stop path needs it."""
    try:
        import psutil  # noqa: F401
    except ImportError:
        pass
