"""The agent's side of the zygote: `Preloaded`, a `process.Starter` that forks workers warm.

It starts the zygote the moment the agent starts, in parallel with the rendezvous: `python -m
launcher.agent.zygote` imports torch, the modules a DDP job would otherwise load lazily in every worker
(`torch._dynamo` alone ~0.85 s; `parsers.PRELOAD_DEFAULTS`), and the user's `--preload_modules`, then
waits on a unix socket.
For each worker the agent sends a `ForkRequest` (argv, environment, working directory) with its
stdin and two pipe ends (SCM_RIGHTS); the zygote forks it (see `server`), re-parented to the agent
(a child subreaper), so that the agent waits on it as on a spawned worker: its own process group,
exact exit codes and signals, pidfd, guard and sweeps all unchanged.

Any trouble (an import error, an unsafe thread, CUDA, the zygote's death) is one line, and every
later worker is spawned: the job never fails because of the preload.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import socket
import subprocess
import time
from collections.abc import Sequence

from ...spec import Exit
from ..process import Spawner, Starter, WorkerProcess
from .messages import ForkRequest, Program, Reply, ZygoteArgs

log = logging.getLogger(__name__)

# Read once, when an interpreter or a native library starts: a worker whose environment differs
# from the zygote's in one of these is spawned, so that it gets exactly what it asked for.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "GOTO_", "KMP_", "GOMP_", "LD_", "MALLOC_", "LC_", "LANG")
APPLIED_AT_FORK = frozenset({"PYTHONFAULTHANDLER", "PYTHONUNBUFFERED"})  # the forked worker applies these itself
READY_TIMEOUT = 120.0  # seconds for the preload imports; past that, workers are spawned (a Ctrl-C waits for it)
REPLY_TIMEOUT = 30.0  # seconds for one fork
# A wait for the imports is said (INFO) once they have taken TELL_AFTER s, then every TELL_EVERY s:
# torch alone takes 2-20 s on a busy host, and the workers start only after it.
TELL_AFTER, TELL_EVERY = 1.0, 10.0


class ZygoteState(enum.Enum):
    STARTING = "starting"  # importing
    READY = "ready"
    GONE = "gone"  # failed, unsafe or dead: every later worker is spawned


class ZygoteLost(Exception):
    """The zygote cannot fork workers any more; the message says why, in one line."""


def startup_settings(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that only takes effect when a process starts."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k not in APPLIED_AT_FORK}


class Preloaded:
    """A `Starter` that forks Python workers from a zygote, and spawns whatever it cannot fork."""

    def __init__(
        self,
        program: Sequence[str],
        module: bool,
        modules: Sequence[str],
        env: dict[str, str],
        *,
        fallback: Starter | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ):
        self.program = tuple(program)  # interpreter, flags and script (or -m and module): the prefix of every argv
        self.target = Program(target=self.program[-1], module=module)  # what every forked worker runs
        self.modules = tuple(modules)  # config.preload_modules: the defaults, less and plus the user's
        self.env = dict(env)
        self.fallback = fallback or Spawner()
        self.ready_timeout = ready_timeout
        self.state = ZygoteState.STARTING
        self.import_seconds: float | None = None
        self._startup = startup_settings(self.env)
        self._started = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        args = ZygoteArgs(sock_fd=theirs.fileno(), agent=os.getpid(), modules=self.modules)
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                args.argv(self.program[0]),
                env=self.env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                process_group=0,
                close_fds=True,
            )
        except OSError as e:
            self.proc = None
            self._give_up(f"cannot start it: {e.strerror or e}")
        finally:
            theirs.close()

    # ------------------------------------------------------------------ the Starter seam

    def start(self, argv: Sequence[str], env: dict[str, str], cpus: frozenset[int] = frozenset()) -> WorkerProcess:
        """Fork the worker from the zygote when it can; spawn it otherwise."""
        if tuple(argv[: len(self.program)]) == self.program and self._wait_ready():
            if startup_settings(env) == self._startup:
                try:
                    return self._fork(tuple(argv[len(self.program) :]), env, cpus)
                except ZygoteLost as e:
                    self._give_up(str(e))
            else:
                changed = sorted(set(startup_settings(env).items()) ^ set(self._startup.items()))
                log.debug("worker spawned, not forked: its start-up environment differs (%s)", changed[0][0])
        return self.fallback.start(argv, env, cpus)

    def helpers(self) -> tuple[int, ...]:
        return (self.proc.pid,) if self.proc is not None and self.state is not ZygoteState.GONE else ()

    def check(self) -> None:
        """Say at once when the zygote has died, not at the next restart (one waitpid per loop turn)."""
        if self.proc is not None and self.state is not ZygoteState.GONE and self.proc.poll() is not None:
            self._give_up(self._death() or "the zygote exited")

    def close(self) -> None:
        """End the zygote: it exits when its socket closes; SIGKILL if it has not within 2 s."""
        self._sock.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.state = ZygoteState.GONE

    # ------------------------------------------------------------------ talking to the zygote

    def _wait_ready(self) -> bool:
        if self.state is ZygoteState.STARTING:
            try:
                reply = self._recv_ready()
            except ZygoteLost as e:
                self._give_up(str(e))
                return False
            if reply.error:
                self._give_up(reply.error)
                return False
            self.state, self.import_seconds = ZygoteState.READY, reply.seconds
            log.debug(
                "preload: zygote pid %s ready after %.2f s of imports",
                self.proc and self.proc.pid,
                self.import_seconds or 0,
            )
        return self.state is ZygoteState.READY

    def _recv_ready(self) -> Reply:
        """The zygote's reply once its imports are done, within `ready_timeout`; a long wait is said."""
        deadline = time.monotonic() + self.ready_timeout
        tell = self._started + TELL_AFTER
        while not select.select([self._sock], [], [], max(0.0, min(tell, deadline) - time.monotonic()))[0]:
            now = time.monotonic()
            if now >= deadline:
                raise ZygoteLost(f"it did not finish its imports within {self.ready_timeout:g} s")
            if now >= tell:
                tell = now + TELL_EVERY
                log.info(
                    "importing torch once for the workers to fork from (--preload), %.0f s so far;"
                    " they start when it is done",
                    now - self._started,
                )
        return self._recv(max(0.001, deadline - time.monotonic()), "finish its imports")

    def _fork(self, args: tuple[str, ...], env: dict[str, str], cpus: frozenset[int]) -> WorkerProcess:
        request = ForkRequest(program=self.target, args=args, env=env, cwd=os.getcwd(), cpus=tuple(sorted(cpus)))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            fds = [out_w, err_w] + ([0] if _valid_fd(0) else [])
            try:
                socket.send_fds(self._sock, [request.encode()], fds)
            except OSError as e:
                raise ZygoteLost(self._death() or f"cannot reach it: {e.strerror or e}") from None
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            reply = self._recv(REPLY_TIMEOUT, "fork a worker")
            if reply.error or reply.pid is None:
                raise ZygoteLost(reply.error or "it answered without a pid")
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        return WorkerProcess(reply.pid, open(out_r, "rb"), open(err_r, "rb"), forked=True)

    def _recv(self, timeout: float, doing: str) -> Reply:
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(1 << 16)
        except TimeoutError:
            raise ZygoteLost(f"it did not {doing} within {timeout:g} s") from None
        except OSError as e:
            data = b""
            log.debug("preload: zygote socket: %s", e)
        if not data:
            raise ZygoteLost(self._death() or "it closed its socket")
        return Reply.decode(data)

    def _death(self) -> str:
        if self.proc is None:
            return ""
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return ""
        return f"the zygote (pid {self.proc.pid}) {Exit(code).describe()}"

    def _give_up(self, why: str) -> None:
        if self.state is ZygoteState.GONE:
            return
        log.warning("preload: %s; workers are spawned instead, as without --preload", why)
        self.close()


def _valid_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
