"""Warm start: workers forked from a preloaded interpreter (the zygote) instead of exec'd fresh.

`Preloaded` is the agent's side, a `process.Starter`. It starts the zygote the moment the agent
starts, in parallel with the rendezvous: `python -m launcher.zygote` imports torch, the modules a
DDP job would otherwise load lazily in every worker (`torch._dynamo` alone ~0.85 s), and the
user's `--preload_modules`, then waits on a unix socket. For each worker the agent sends its argv,
environment and working directory, with its stdin and two pipe ends (SCM_RIGHTS). The zygote forks
twice, so that the worker is re-parented to the agent (a child subreaper): the agent then waits on
it as on a spawned worker — its own process group, exact exit codes and signals, pidfd, guard and
sweeps all unchanged. The forked worker resets its signals, takes its environment, argv,
`sys.path[0]` and `__main__` (a script, or `-m module` like `python -m`), and runs.

Fork safety: the zygote never initialises CUDA and never runs an op. Before every fork it checks
that it holds no thread but its main one. numpy's OpenBLAS pool (alive after `import torch` unless
OMP_NUM_THREADS=1) is retired by OpenBLAS's own pthread_atfork handler, so a probe fork after each
preloaded module tells a pool that cleans up after itself from a thread that would be unsafe. Any
trouble (an import error, an unsafe thread, CUDA, the zygote's death) is one line, and every later
worker is spawned: the job never fails because of the preload.
"""

from __future__ import annotations

import enum
import logging
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from .process import PR_SET_PDEATHSIG, Spawner, Starter, WorkerProcess, prctl, set_name
from .spec import Exit

log = logging.getLogger(__name__)

# What `import torch` leaves for the first DDP step to load: measured with a one-rank gloo step
# (824 modules, mostly sympy through torch._dynamo, and torch.distributed's own).
DEFAULT_MODULES = (
    "torch",
    "torch.distributed",
    "torch.distributed.distributed_c10d",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.nn.parallel",
    "torch.optim",
    "torch._dynamo",
)
# Read once, when an interpreter or a native library starts: a worker whose environment differs
# from the zygote's in one of these is spawned, so that it gets exactly what it asked for.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "GOTO_", "KMP_", "GOMP_", "LD_", "MALLOC_", "LC_", "LANG")
APPLIED_AT_FORK = frozenset({"PYTHONFAULTHANDLER", "PYTHONUNBUFFERED"})  # the forked worker applies these itself
READY_TIMEOUT = 120.0  # seconds for the preload imports; past that, workers are spawned (a Ctrl-C waits for it)
REPLY_TIMEOUT = 30.0  # seconds for one fork


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
        self.module = module
        self.modules = tuple(dict.fromkeys([*DEFAULT_MODULES, *modules]))
        self.env = dict(env)
        self.fallback = fallback or Spawner()
        self.ready_timeout = ready_timeout
        self.state = ZygoteState.STARTING
        self.import_seconds: float | None = None
        self._startup = startup_settings(self.env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [self.program[0], "-m", "launcher.zygote", str(theirs.fileno()), str(os.getpid()), *self.modules],
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

    def start(self, argv: Sequence[str], env: dict[str, str]) -> WorkerProcess:
        """Fork the worker from the zygote when it can; spawn it otherwise."""
        if tuple(argv[: len(self.program)]) == self.program and self._wait_ready():
            if startup_settings(env) == self._startup:
                try:
                    return self._fork(list(argv[len(self.program) :]), env)
                except ZygoteLost as e:
                    self._give_up(str(e))
            else:
                changed = sorted(set(startup_settings(env).items()) ^ set(self._startup.items()))
                log.debug("worker spawned, not forked: its start-up environment differs (%s)", changed[0][0])
        return self.fallback.start(argv, env)

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
                reply = self._recv(self.ready_timeout, "finish its imports")
            except ZygoteLost as e:
                self._give_up(str(e))
                return False
            if "error" in reply:
                self._give_up(reply["error"])
                return False
            self.state, self.import_seconds = ZygoteState.READY, reply.get("seconds")
            log.debug(
                "preload: zygote pid %s ready after %.2f s of imports",
                self.proc and self.proc.pid,
                self.import_seconds or 0,
            )
        return self.state is ZygoteState.READY

    def _fork(self, args: list[str], env: dict[str, str]) -> WorkerProcess:
        request = marshal.dumps(
            {"target": self.program[-1], "module": self.module, "args": args, "env": env, "cwd": os.getcwd()}
        )
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            fds = [out_w, err_w] + ([0] if _valid_fd(0) else [])
            try:
                socket.send_fds(self._sock, [request], fds)
            except OSError as e:
                raise ZygoteLost(self._death() or f"cannot reach it: {e.strerror or e}") from None
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            reply = self._recv(REPLY_TIMEOUT, "fork a worker")
            if "error" in reply:
                raise ZygoteLost(reply["error"])
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        return WorkerProcess(reply["pid"], open(out_r, "rb"), open(err_r, "rb"), forked=True)

    def _recv(self, timeout: float, doing: str) -> dict:
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
        return marshal.loads(data)

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


# ============================================================================ the zygote's side


def main(argv: list[str]) -> dict:
    """Preload, then fork workers on request; returns only in a forked worker, with its request."""
    sock = socket.socket(fileno=int(argv[1]))
    _die_with(int(argv[2]))
    comm = set_name("launcher-zygote")  # what ps and top show; a forked worker takes the interpreter's back
    reply = preload(argv[3:])
    _send(sock, reply)
    if "error" in reply:
        os._exit(0)
    import gc

    gc.collect()
    gc.freeze()  # what the preload allocated stays out of the collector: fewer pages copied on write
    job = serve(sock)
    sock.close()  # in the worker only: the agent must see EOF when the zygote itself dies
    job["agent"], job["comm"] = int(argv[2]), comm
    return job


def preload(modules: Sequence[str]) -> dict:
    """Import `modules` one by one; an import error or an unsafe thread is named, one line."""
    import importlib

    t0 = time.perf_counter()
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit and KeyboardInterrupt included: report, never die silently
            first = (str(e).strip().splitlines() or [""])[0]
            return {"error": f"module {name!r} failed to import ({type(e).__name__}: {first})"}
        why = unsafe_to_fork() or _cuda_driver_loaded()
        if why:
            return {"error": f"module {name!r} {why}"}
    return {"seconds": round(time.perf_counter() - t0, 3)}


def _cuda_driver_loaded() -> str:
    """A CUDA driver initialised without torch knowing (cuInit through another library) is as unsafe."""
    try:
        with open("/proc/self/maps") as f:
            if any("libcuda.so" in line for line in f):
                return "loaded the CUDA driver (libcuda), which a forked worker cannot use"
    except OSError:
        pass
    return ""


def unsafe_to_fork() -> str:
    """Why forking now would be unsafe ("" when it is safe): a live thread, or CUDA initialised."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "initialised CUDA, which a forked worker cannot use"
    if len(os.listdir("/proc/self/task")) > 1:
        probe = os.fork()  # pthread_atfork handlers (OpenBLAS's) retire the pools that are fork-safe
        if probe == 0:
            os._exit(0)
        os.waitpid(probe, 0)
    left = [t for t in os.listdir("/proc/self/task") if int(t) != os.getpid()]
    if not left:
        return ""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    shown = []
    for tid in left[:3]:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            comm = "?"
        shown.append(names.get(int(tid), comm))
    return f"left {len(left)} thread(s) running ({', '.join(shown)}), which a fork would not copy"


def serve(sock: socket.socket) -> dict:
    """Fork one worker per request until the agent closes the socket (then exit)."""
    while True:
        sock.settimeout(None)
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)
        job = marshal.loads(data)
        job["fds"] = fds
        why = unsafe_to_fork()
        if why:
            _close(fds)
            _send(sock, {"error": f"the preloaded interpreter {why}"})
            continue
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:  # exits at once, so that the worker is re-parented to the agent
            try:
                worker = os.fork()
            except OSError:
                os._exit(1)
            if worker == 0:
                os.close(r)
                os.close(w)
                return job
            try:
                os.setpgid(worker, worker)  # as the worker does itself: whichever runs first
            except OSError:
                pass
            try:
                os.write(w, b"%d" % worker)
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            pid = f.read()
        os.waitpid(middle, 0)
        _close(fds)
        _send(sock, {"pid": int(pid)} if pid else {"error": "a fork failed"})


def become_worker(job: dict) -> None:
    """In the forked worker: take its process group, stdio, signals, environment and argv, then run."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _await_adoption(job["agent"])
    set_name(job["comm"])
    out, err, *stdin = job["fds"]
    if not stdin:
        stdin = [os.open(os.devnull, os.O_RDONLY)]
    for fd, target in ((stdin[0], 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    _close(fd for fd in (stdin[0], out, err) if fd > 2)
    for sig in signal.valid_signals():  # what a fresh python has: defaults, SIGINT raises, SIGPIPE ignored
        handler = {
            signal.SIGINT: signal.default_int_handler,
            signal.SIGPIPE: signal.SIG_IGN,
            signal.SIGXFSZ: signal.SIG_IGN,
        }.get(sig, signal.SIG_DFL)
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP, glibc's own
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    sys.stdout.reconfigure(write_through=True)  # the workers' `python -u`
    sys.stderr.reconfigure(write_through=True)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable(all_threads=True)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # `random` reseeds itself after a fork; numpy's global state does not
        numpy_random.seed()


def run_worker(job: dict) -> None:
    """Run the worker's script or module as `__main__`, as `python SCRIPT` or `python -m MODULE` would."""
    import runpy

    target, args = job["target"], job["args"]
    if job["module"]:
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif os.path.isfile(target):  # as the interpreter runs a script: __file__ absolute, argv[0] as typed
        import types
        from importlib.machinery import SourceFileLoader

        path = os.path.abspath(target)
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        main = types.ModuleType("__main__")
        main.__dict__.update(
            __file__=path,
            __cached__=None,
            __loader__=SourceFileLoader("__main__", path),
            __builtins__=sys.modules["builtins"],
        )
        sys.modules["__main__"] = main
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, main.__dict__)
    else:  # a folder or a zip with __main__.py
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")


def _await_adoption(agent: int) -> None:
    """Return once the short-lived middle process has exited and the agent is this worker's parent."""
    middle = os.getppid()
    if middle == agent:
        return
    try:
        fd = os.pidfd_open(middle)  # readable once it has exited, after its children were re-parented
    except OSError:  # gone already
        return
    try:
        select.select([fd], [], [], 2.0)
    finally:
        os.close(fd)


def _die_with(parent: int) -> None:
    """SIGKILL this process when the agent dies, whatever kills it."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the agent died before the line above
        os._exit(1)


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.sendall(marshal.dumps(message))
    except OSError:  # the agent is gone
        os._exit(0)


def _close(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


if __name__ == "__main__":
    _job = main(sys.argv)
    become_worker(_job)
    run_worker(_job)
