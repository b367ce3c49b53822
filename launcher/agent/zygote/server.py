"""The zygote: a preloaded interpreter that forks workers on the agent's request.

`python -m launcher.agent.zygote FD AGENT MODULE…` imports the modules, says it is ready, then forks one
worker per `ForkRequest`. It forks twice, so that the worker is re-parented to the agent (a child
subreaper). The forked worker resets its signals, takes its environment, argv, `sys.path[0]` and
`__main__` (a script, or `-m module` like `python -m`), and runs.

Fork safety: the zygote never initialises CUDA and never runs an op. Before every fork it checks
that it holds no thread but its main one. numpy's OpenBLAS pool (alive after `import torch` unless
OMP_NUM_THREADS=1) is retired by OpenBLAS's own pthread_atfork handler, so a probe fork after each
preloaded module tells a pool that cleans up after itself from a thread that would be unsafe.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable, Sequence

from ..process import PR_SET_PDEATHSIG, prctl, set_name
from ..quick_exit import run_program
from .messages import ForkRequest, Job, Reply, ZygoteArgs


def main(argv: list[str]) -> Job:
    """Preload, then fork workers on request; returns only in a forked worker, with its job."""
    args = ZygoteArgs.parse(argv)
    sock = socket.socket(fileno=args.sock_fd)
    _die_with(args.agent)
    comm = set_name("launcher-zygote")  # what ps and top show; a forked worker takes the interpreter's back
    reply = preload(args.modules)
    _send(sock, reply)
    if reply.error:
        os._exit(0)
    gc.collect()  # the preload's garbage, once (it ran with the collector off)
    gc.freeze()  # what the preload allocated stays out of the collector: fewer pages copied on write
    job = serve(sock)
    sock.close()  # in the worker only: the agent must see EOF when the zygote itself dies
    job.agent, job.comm = args.agent, comm
    return job


def preload(modules: Sequence[str]) -> Reply:
    """Import `modules` one by one, the cyclic collector off; an import error or an unsafe thread is
    named, one line."""
    import importlib

    t0 = time.perf_counter()
    # What an import makes lives as long as its module: each collection during the preload walks it all
    # again and frees next to nothing (~0.3 s of the default set's ~2.2 s of CPU). The caller collects once.
    gc.disable()
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException as e:  # SystemExit and KeyboardInterrupt included: report, never die silently
                first = (str(e).strip().splitlines() or [""])[0]
                return Reply(error=f"module {name!r} failed to import ({type(e).__name__}: {first})")
            why = unsafe_to_fork() or _cuda_driver_initialised()
            if why:
                return Reply(error=f"module {name!r} {why}")
    finally:
        gc.enable()
    return Reply(seconds=round(time.perf_counter() - t0, 3))


def _cuda_driver_initialised() -> str:
    """A CUDA driver initialised without torch knowing (cuInit through another library) is as unsafe.

    Loaded is not initialised: CUDA builds of torch (2.11 with CUDA 13, for one) map libcuda at
    import, and a fork before cuInit is safe. The loaded driver itself says which: a call that needs
    cuInit answers CUDA_ERROR_NOT_INITIALIZED (3) until then, and initialises nothing.
    """
    try:
        with open("/proc/self/maps") as f:
            if not any("libcuda.so" in line for line in f):
                return ""
    except OSError:
        return ""
    import ctypes

    try:
        # RTLD_NOLOAD: the handle of the copy already mapped, never a second load
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        count = ctypes.c_int(0)
        code = driver.cuDeviceGetCount(ctypes.byref(count))
    except (OSError, AttributeError) as e:
        return f"loaded the CUDA driver (libcuda), which could not be asked whether it was initialised ({e})"
    if code == _CUDA_ERROR_NOT_INITIALIZED:
        return ""
    if code == 0:
        return "initialised the CUDA driver (cuInit), which a forked worker cannot use"
    return f"left the CUDA driver in a state a forked worker cannot trust (cuDeviceGetCount: error {code})"


_CUDA_ERROR_NOT_INITIALIZED = 3


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


def serve(sock: socket.socket) -> Job:
    """Fork one worker per request until the agent closes the socket (then exit)."""
    while True:
        sock.settimeout(None)
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)
        job = Job(ForkRequest.decode(data), fds)
        why = unsafe_to_fork()
        if why:
            _close(fds)
            _send(sock, Reply(error=f"the preloaded interpreter {why}"))
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
        _send(sock, Reply(pid=int(pid)) if pid else Reply(error="a fork failed"))


def become_worker(job: Job) -> None:
    """In the forked worker: take its process group, stdio, signals, environment and argv, then run."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _await_adoption(job.agent)
    set_name(job.comm)
    out, err, *stdin = job.fds
    if not stdin:
        stdin = [os.open(os.devnull, os.O_RDONLY)]
    for fd, target in ((stdin[0], 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    _close(fd for fd in (stdin[0], out, err) if fd > 2)
    if job.request.cpus:  # --numa_binding, before the worker has a thread of its own
        try:
            os.sched_setaffinity(0, job.request.cpus)
        except OSError as e:  # said on the worker's own stderr, which the agent logs
            print(
                f"launcher: cannot bind this worker to its CPUs ({e.strerror or e}); it runs unbound",
                file=sys.stderr,
                flush=True,
            )
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
    os.environ.update(job.request.env)
    os.chdir(job.request.cwd)
    sys.stdout.reconfigure(write_through=True)  # the workers' `python -u`
    sys.stderr.reconfigure(write_through=True)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable(all_threads=True)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # `random` reseeds itself after a fork; numpy's global state does not
        numpy_random.seed()
    _keep_default_group_alive()


def _keep_default_group_alive() -> None:
    """Give the worker's first default process group the lifetime it has in a spawned worker.

    In a spawned worker DDP imports `torch.distributed.nn` after `init_process_group`, and that
    module's functions take `group=group.WORLD` as a default argument: the default group then lives
    until the interpreter exits. The zygote imported it (through `torch._dynamo`) before any group
    existed, so in a forked worker nothing but the user's objects holds the group, and it dies with
    the DDP model. gloo's destructor then joins its worker threads holding the GIL while one of them
    waits for the GIL to release a Python object its last collective captured (a deadlock in torch).
    """
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    update = getattr(c10d, "_update_default_pg", None)
    if "torch.distributed.nn.functional" not in sys.modules or not callable(update):
        return  # imported lazily after the group, as in a spawned worker: nothing differs

    def update_default_pg(pg):
        if pg is not None and not _FIRST_GROUP:
            _FIRST_GROUP.append(pg)
        return update(pg)

    c10d._update_default_pg = update_default_pg


_FIRST_GROUP: list = []  # the forked worker's first default process group, held until it exits


def run_worker(job: Job) -> None:
    """Run the worker's script or module as `__main__`, as `python SCRIPT` or `python -m MODULE` would."""
    run_program(job.request.program.target, job.request.program.module, job.request.args)


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


def _send(sock: socket.socket, reply: Reply) -> None:
    try:
        sock.sendall(reply.encode())
    except OSError:  # the agent is gone
        os._exit(0)


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
