"""Thousands of simulated nodes in one process, each running the launcher's real (blocking) code
over real sockets: every node is a greenlet, and a socket call that would block switches to a hub
that waits on all of them with one epoll. No thread per node, so the harness costs what the
protocol costs, not a GIL convoy of thousands of threads (a bench-only dependency: `pip install greenlet`).

`green(module)` gives a module's `socket` and `time` green twins (`create_connection` returns a
`GreenSocket`; `sleep` yields to the hub); `Hub.run` runs callables as greenlets until all are done.
Only what the launcher's store clients use is covered: connect, sendall, recv, settimeout, shutdown,
close, setsockopt, fileno.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import select
import socket
import time
import types
from collections.abc import Callable

import greenlet

IN, OUT, ET, BAD = select.EPOLLIN, select.EPOLLOUT, select.EPOLLET, select.EPOLLERR | select.EPOLLHUP


class Hub:
    """One edge-triggered epoll (each socket registered once), a heap of timers, and the greenlets
    waiting on them. A socket is always read (or written) until EAGAIN before its greenlet waits,
    so no edge is missed."""

    def __init__(self) -> None:
        self.ep = select.epoll()
        self.socks: dict[int, GreenSocket] = {}
        self.main = greenlet.getcurrent()
        self.timers: list = []
        self.seq = itertools.count()

    def add(self, gs: GreenSocket) -> None:
        self.socks[gs.fd] = gs
        self.ep.register(gs.fd, IN | OUT | ET)

    def remove(self, gs: GreenSocket) -> None:
        if self.socks.pop(gs.fd, None) is not None:
            self.ep.unregister(gs.fd)

    def wait(self, gs: GreenSocket | None, event: int, timeout: float | None) -> bool:
        """Block this greenlet until `gs` is ready for `event` (True) or `timeout` passes (False)."""
        me = greenlet.getcurrent()
        if me is self.main:
            raise RuntimeError("a green socket used outside a hub task")
        timer = None
        if timeout is not None:
            timer = [time.monotonic() + timeout, next(self.seq), me, True]
            heapq.heappush(self.timers, timer)
        if gs is not None:
            gs.waiter, gs.wants = me, event
        try:
            return self.main.switch()
        finally:
            if gs is not None:
                gs.waiter = None
            if timer is not None:
                timer[3] = False

    def run(self, tasks: list[Callable[[], None]]) -> None:
        """Run every task to its end (each as a greenlet; an exception ends only its own task)."""
        left = [len(tasks)]

        def wrap(task):
            def body():
                try:
                    task()
                finally:
                    left[0] -= 1

            return body

        for task in tasks:
            greenlet.greenlet(wrap(task), parent=self.main).switch()
        while left[0]:
            timeout = -1.0
            while self.timers and not self.timers[0][3]:
                heapq.heappop(self.timers)
            if self.timers:
                timeout = max(0.0, self.timers[0][0] - time.monotonic())
            for fd, ev in self.ep.poll(timeout):
                gs = self.socks.get(fd)
                if gs is not None and gs.waiter is not None and ev & (gs.wants | BAD):
                    gs.waiter.switch(True)
            now = time.monotonic()
            while self.timers and (not self.timers[0][3] or self.timers[0][0] <= now):
                t = heapq.heappop(self.timers)
                if t[3]:
                    t[2].switch(False)


class GreenSocket:
    """A non-blocking socket whose blocking calls wait in the hub."""

    def __init__(self, hub: Hub, sock: socket.socket):
        self.hub, self.sock, self.timeout = hub, sock, None
        self.fd = sock.fileno()
        self.waiter: greenlet.greenlet | None = None
        self.wants = IN
        sock.setblocking(False)
        hub.add(self)

    def settimeout(self, t: float | None) -> None:
        self.timeout = t

    def setsockopt(self, *args) -> None:
        self.sock.setsockopt(*args)

    def fileno(self) -> int:
        return self.fd

    def sendall(self, data) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
            except BlockingIOError:
                self._wait(OUT)

    def recv(self, n: int) -> bytes:
        while True:
            try:
                return self.sock.recv(n)
            except BlockingIOError:
                self._wait(IN)

    def _wait(self, event: int) -> None:
        if self.timeout == 0:  # settimeout(0): non-blocking, as a real socket is
            raise BlockingIOError(errno.EAGAIN, "would block")
        if not self.hub.wait(self, event, self.timeout):
            raise TimeoutError("timed out")

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.hub.remove(self)
        self.sock.close()


def green(hub: Hub, *modules: types.ModuleType) -> None:
    """Give each module green `socket` and `time` (a copy of the real module with the blocking calls replaced)."""
    gsock = types.ModuleType("socket")
    gsock.__dict__.update(socket.__dict__)
    gtime = types.ModuleType("time")
    gtime.__dict__.update(time.__dict__)

    def create_connection(address, timeout=None, *_, **__):
        gs = GreenSocket(
            hub, socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
        )
        err = gs.sock.connect_ex(address)
        if err in (errno.EINPROGRESS, errno.EAGAIN):
            if not hub.wait(gs, OUT, timeout):
                gs.close()
                raise TimeoutError("timed out")
            err = gs.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            gs.close()
            raise OSError(err, errno.errorcode.get(err, str(err)))
        return gs

    gsock.create_connection = create_connection
    gtime.sleep = lambda s: hub.wait(None, 0, max(0.0, s))
    for m in modules:
        m.socket = gsock
        m.time = gtime


def release_green(
    m: int,
    prepare: Callable[[int], Callable[[], object]],
    modules: list[types.ModuleType],
    background: Callable[[Hub, Callable[[], bool]], list[Callable[[], None]]] | None = None,
) -> dict:
    """release_together (benchlib) with greenlets: m simulated nodes of one hub, the blocking calls
    of `modules` made green. prepare(j) builds node j (untimed, as a hub task too: connecting blocks)
    and returns the call that joins a round; print "ready", and on a line from stdin start every
    join at once. `background(hub, finished)` gives tasks that run beside the joins until
    finished() is true (an etcd lease's keep-alive). -> t0, end, setup_s, cpu_s, done, errors."""
    import gc
    import resource
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection or more per simulated node
    hub = Hub()
    green(hub, *modules)
    joins: list = [None] * m
    results: list = [None] * m

    def build(j: int) -> None:
        try:
            joins[j] = prepare(j)
        except Exception as e:
            results[j] = f"setup: {type(e).__name__}: {e}"

    def join(j: int) -> None:
        try:
            results[j] = (joins[j](), time.time())
        except Exception as e:
            results[j] = f"{type(e).__name__}: {e}".strip()
        left[0] -= 1

    t = time.monotonic()
    hub.run([lambda j=j: build(j) for j in range(m)])
    setup_s = time.monotonic() - t
    # One process holds what thousands of agents would each hold in their own: Python's cyclic GC
    # would scan all of it at every full collection, a cost per operation that grows with the node
    # count (no agent has it). The nodes as built are frozen out of the collector's scans.
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    sys.stdin.readline()
    t0, cpu0 = time.time(), time.process_time()
    todo = [j for j in range(m) if joins[j] is not None]
    left = [len(todo)]
    extra = background(hub, lambda: left[0] == 0) if background else []
    hub.run([lambda j=j: join(j) for j in todo] + extra)
    return {
        "t0": t0,
        "end": time.time(),
        "setup_s": setup_s,
        "cpu_s": time.process_time() - cpu0,
        "done": [r for r in results if isinstance(r, tuple)],
        "errors": [r for r in results if not isinstance(r, tuple)],
    }
