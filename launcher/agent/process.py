"""Process mechanism, no policy: spawn a worker, notice its exit, kill its whole tree.

Three layers keep orphans away, grandchildren included:
- every worker leads its own process group, so one `killpg` reaches what it forked;
- the agent is a child subreaper, so a grandchild that left the group (setsid, double fork)
  is re-parented to the agent and found by a descendant sweep instead of escaping to init;
- a guard process, forked before any thread exists, holds a pipe from the agent: if the agent
  dies, even by SIGKILL, the pipe closes and the guard kills every process that carries this
  agent's id in its environment.
The guard is also the one who knows that the agent died (not merely lost a connection): it sends
the agent's last wills (`Guard.will`: the rendezvous store's death certificate) at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..net import lookup_form
from ..spec import Exit

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import IO, Protocol
else:
    Protocol = object  # the type checker's; at run time a plain base

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, arg: int | bytes) -> bool:
    """prctl(2) on this process (Linux); False where it fails or does not exist."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def set_name(name: str) -> str:
    """Name this process (/proc/self/comm, what ps and top show; 15 bytes, no ctypes); returns the old name."""
    try:
        with open("/proc/self/comm", "r+") as f:
            old = f.read().strip()
            f.seek(0)
            f.write(name)
        return old
    except OSError:
        return name


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux), so the sweep can find them."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


class WorkerProcess:
    """One worker, started by any `Starter`: its pid, a pidfd to wait on, and its output pipes.

    A spawned worker is waited through its Popen; a forked one (see `zygote`) is a child of this
    agent too (adopted as the subreaper) and is waited with `waitpid` directly.
    """

    def __init__(
        self,
        pid: int,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        popen: subprocess.Popen | None = None,
        forked: bool = False,
    ):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.popen = popen
        self.forked = forked  # started by the preloaded zygote, not exec'd
        self._exit: Exit | None = None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # old kernel: the monitor interval poll still finds the exit
            self.pidfd = None

    @classmethod
    def of(cls, popen: subprocess.Popen) -> WorkerProcess:
        return cls(popen.pid, popen.stdout, popen.stderr, popen=popen)

    def poll(self) -> Exit | None:
        """The exit, once the process has ended (reaps it); None while it runs."""
        if self._exit is None:
            if self.popen is not None:
                code = self.popen.poll()
            else:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: the exit code is lost
                    pid, status = self.pid, 255 << 8
                code = os.waitstatus_to_exitcode(status) if pid else None
            self._exit = None if code is None else Exit(code)
        return self._exit

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the worker's whole process group (ignores an already-gone group)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def send(self, sig: int) -> None:
        """Send `sig` to the worker process alone."""
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stopped(self) -> bool:
        """Whether the worker process is stopped (`stopped`): it acts on no signal but SIGKILL."""
        import psutil

        try:
            return bool(stopped([psutil.Process(self.pid)]))
        except psutil.Error:  # gone
            return False

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def spawn(argv: Sequence[str], env: dict[str, str], capture: bool = True) -> WorkerProcess:
    """Start one worker in a new process group, its stdout and stderr on pipes."""
    pipe = subprocess.PIPE if capture else None
    popen = subprocess.Popen(list(argv), env=env, stdout=pipe, stderr=pipe, process_group=0, close_fds=True)
    return WorkerProcess.of(popen)


@contextlib.contextmanager
def inherited_affinity(cpus: frozenset[int]) -> Iterator[None]:
    """Bind this thread to `cpus` (when not empty) for the block: a process it starts inherits them.

    The child has its CPUs from its first instruction, before any thread of its own, with no
    preexec_fn (unsafe in a threaded agent); the agent's thread gets its own set back at once."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    try:
        # pid 0 is the calling thread, not the whole agent: its other threads keep running where they were
        os.sched_setaffinity(0, cpus)
    except OSError as e:  # e.g. a cgroup changed under the agent: the worker still starts, unbound
        log.warning("cannot bind a worker to CPUs %s (%s); it runs unbound", sorted(cpus), e.strerror or e)
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Starter(Protocol):
    """The seam that starts a worker: exec'd fresh (`Spawner`) or forked warm (`zygote.client.Preloaded`)."""

    def start(self, argv: Sequence[str], env: dict[str, str], cpus: frozenset[int] = frozenset()) -> WorkerProcess:
        """Start one worker in its own process group, stdout and stderr on pipes, on `cpus` (empty: any)."""

    def helpers(self) -> tuple[int, ...]:
        """Pids of the starter's own long-lived processes, which worker sweeps must spare."""

    def check(self) -> None:
        """Notice, cheaply, that a helper process died (said in one line); run once per loop turn."""

    def close(self) -> None:
        """Stop the starter's own processes (the job is over)."""


class Spawner:
    """Every worker a fresh interpreter (or command): `subprocess.Popen`, nothing kept between rounds."""

    def __init__(self, spawn_fn: Callable[[Sequence[str], dict[str, str]], WorkerProcess] = spawn):
        self.spawn_fn = spawn_fn

    def start(self, argv: Sequence[str], env: dict[str, str], cpus: frozenset[int] = frozenset()) -> WorkerProcess:
        with inherited_affinity(cpus):
            return self.spawn_fn(argv, env)

    def helpers(self) -> tuple[int, ...]:
        return ()

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


# Out of descriptors or processes for a moment (a store host under a burst of connections): a
# spawn is retried for this long, not taken for a worker that cannot start (issue 23).
SPAWN_RETRY = 30.0
TRANSIENT_SPAWN = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


def start_retrying(
    starter: Starter, argv: Sequence[str], env: dict[str, str], clock: Callable[[], float] = time.monotonic
) -> WorkerProcess:
    """`starter.start`, a transient EMFILE/ENFILE/EAGAIN/ENOMEM retried (said once) for up to SPAWN_RETRY s."""
    deadline, delay = None, 0.05
    while True:
        try:
            return starter.start(argv, env)
        except OSError as e:
            if e.errno not in TRANSIENT_SPAWN:
                raise
            now = clock()
            if deadline is None:
                deadline = now + SPAWN_RETRY
                log.warning("cannot start a worker yet (%s): retrying for up to %g s", e.strerror or e, SPAWN_RETRY)
            if now >= deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 1.0)


# ---------------------------------------------------------------------------- sweeping


def children() -> set[int] | None:
    """Pids of this process's direct children, from /proc (None where the kernel does not say)."""
    found: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                found.update(int(pid) for pid in f.read().split())
    except (OSError, ValueError):
        return None
    return found


def descendants(exclude: Iterable[int] = ()) -> list:
    """psutil handles of every live process below this one, minus `exclude` pids."""
    skip = set(exclude)
    kids = children()
    if kids is not None and kids <= skip:  # nothing below us: spare the psutil import and /proc scan
        return []
    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in procs if p.pid not in skip]


def stopped(procs: Iterable) -> list:
    """Those of `procs` (psutil handles) that are stopped: by a signal (SIGSTOP, SIGTSTP...: state T) or
    in a tracer's hold (a debugger: t)."""
    import psutil

    found = []
    for p in procs:
        try:
            if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                found.append(p)
        except psutil.Error:
            pass
    return found


def pgid(pid: int) -> int:
    """The process group of `pid` (-1 once it is gone)."""
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def kill_procs(procs: Iterable, sig: int) -> None:
    import psutil

    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def reap_adopted(owned: Iterable[int]) -> None:
    """Collect zombies the subreaper adopted; never touches pids a Popen owns."""
    kids = children()
    if kids is None:  # no /proc children files: ask psutil
        import psutil

        try:
            kids = {p.pid for p in psutil.Process().children()}
        except psutil.Error:
            return
    for pid in kids - set(owned):
        try:
            os.waitpid(pid, os.WNOHANG)  # a live child (the guard) is left alone
        except ChildProcessError:
            pass


# ---------------------------------------------------------------------------- the guard


class Guard:
    """A forked watchdog that kills this agent's processes if the agent dies without cleaning up."""

    def __init__(self, agent_id: str):
        self.agent_id = agent_id
        self.pid = 0
        self._fd = -1

    def start(self) -> Guard:
        """Fork the guard; call before any thread starts."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guard
            os.close(w)
            _guard_main(r, self.agent_id)  # never returns
        os.close(r)
        os.set_inheritable(w, False)
        self.pid, self._fd = pid, w
        return self

    def watch(self, pid: int) -> None:
        """Tell the guard about a worker so it can kill its group first."""
        if self._fd >= 0:
            try:
                os.write(self._fd, b"%d\n" % pid)
            except OSError:
                pass

    def will(self, host: str, port: int, payload: bytes, answer: int = 0) -> None:
        """If the agent dies, the guard sends `payload` to host:port on a connection of its own and reads
        `answer` bytes back (0: until the server closes; 2 s at most): how the others learn of a death at once."""
        if self._fd >= 0 and " " not in host:
            try:
                os.write(self._fd, b"will %s %d %s %d\n" % (host.encode(), port, payload.hex().encode(), answer))
            except OSError:
                log.debug("could not hand the guard a last will", exc_info=True)

    def remove(self, path: str) -> None:
        """If the agent dies, the guard removes the folder `path` (the workers' memory: it outlives them)
        once it has killed the agent's processes."""
        if self._fd >= 0:
            try:
                os.write(self._fd, b"remove %s\n" % path.encode().hex().encode())
            except OSError:
                log.debug("could not hand the guard a folder to remove", exc_info=True)

    def stop(self) -> None:
        """Clean exit: the guard leaves without killing anything."""
        if self._fd >= 0:
            try:
                os.write(self._fd, b"done\n")
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


def _guard_main(fd: int, agent_id: str) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)  # a terminal's Ctrl-C must not take the guard down
    set_name("launcher-guard")
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
    except OSError:
        pass
    lines = data.split(b"\n")
    if b"done" not in lines:  # the agent died without cleaning up
        for line in lines:
            if line.isdigit():
                try:
                    os.killpg(int(line), signal.SIGKILL)
                except OSError:
                    pass
        for line in lines:
            if line.startswith(b"will "):
                _send_will(line)
        kill_marked(agent_id)
        for line in lines:
            if line.startswith(b"remove "):
                _remove(bytes.fromhex(line[7:].decode()).decode())
    os._exit(0)


def _remove(path: str) -> None:
    """Remove a folder the dead agent's workers wrote in. A worker SIGKILLed a moment ago may still finish
    the write it was in (the kill lands on its way back to user space): what it adds is removed again."""
    import shutil

    for _ in range(20):
        shutil.rmtree(path, ignore_errors=True)  # the guard has nobody to tell: it tries again instead
        if not os.path.lexists(path):
            return
        time.sleep(0.05)


def _send_will(line: bytes) -> None:
    """`will HOST PORT HEX ANSWER`: send the bytes, read the answer (the server has acted on them)."""
    try:
        _, host, port, payload, answer = line.decode().split(" ")
        with socket.create_connection((lookup_form(host), int(port)), timeout=2.0) as sock:
            sock.sendall(bytes.fromhex(payload))
            got, want = 0, int(answer)
            while want == 0 or got < want:  # never a half-close: an HTTP server may take it for a cancel
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += len(chunk)
    except (OSError, ValueError):  # nothing to tell anyone: the store is gone too, or its lease ends it
        pass


def kill_marked(agent_id: str, sig: int = signal.SIGKILL) -> int:
    """SIGKILL every process whose environment carries this agent's id; returns how many."""
    marker = b"\0LAUNCHER_AGENT_ID=" + agent_id.encode() + b"\0"
    me, killed = os.getpid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = b"\0" + f.read()
        except OSError:
            continue
        if marker in environ + b"\0":
            try:
                os.kill(int(name), sig)
                killed += 1
            except OSError:
                pass
    return killed


def is_tty(stream: IO | None = None) -> bool:
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def sweep(spared: list[int], reaped: list[int], graceful: bool) -> None:
    """Kill every descendant of this process but the `spared` pids (the guard, the zygote): whatever
    the workers left behind (daemons, escaped grandchildren), SIGTERM first when `graceful`; then
    reap `reaped`."""
    leftovers = descendants(spared)
    if leftovers:
        import psutil

        if graceful:
            kill_procs(leftovers, signal.SIGTERM)
            _, leftovers = psutil.wait_procs(leftovers, timeout=1.0)
        kill_procs(leftovers, signal.SIGKILL)
        psutil.wait_procs(leftovers, timeout=1.0)
    reap_adopted(reaped)
