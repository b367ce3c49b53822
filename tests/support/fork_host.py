"""A process that has imported torch.distributed once and forks a child for each Python snippet asked of
it (`python fork_host.py SOCKET`), so that the tests' torch store servers and clients do not each spend
~2.5 s of CPU importing torch. tests/support/forks.py is its client.

Each request is one connection to SOCKET: a JSON message {"code", "args", "env", "cwd"} with the child's
stdin, stdout and stderr passed along (SCM_RIGHTS). The host answers the child's pid, then, when the
child has ended, its exit status as `Popen.returncode` reads it (-N for signal N), and closes.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import traceback

import torch.distributed  # noqa: F401 - what every child shares


def child(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -c CODE ARGS...` on the passed streams; never returns."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["-c", *request["args"]]
    status = 0
    try:
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def main() -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sys.argv[1])
    listener.listen(16)
    # SIGCHLD wakes the loop through this pipe (set_wakeup_fd): the ended children are reaped there
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ, "accept")
    events.register(wake_r, selectors.EVENT_READ, "reap")
    events.register(sys.stdin, selectors.EVENT_READ, "end")  # closed when the tests' process ends
    conns: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in events.select():
            if key.data == "end":
                for pid in conns:
                    os.kill(pid, signal.SIGKILL)
                return
            if key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    child(json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                conns[pid] = conn
            else:
                os.read(wake_r, 4096)
                while conns:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = conns.pop(pid, None)
                    if conn is not None:
                        code = os.waitstatus_to_exitcode(status)
                        try:
                            conn.sendall(f"{code}\n".encode())
                        except OSError:
                            pass  # the test gave up on it
                        conn.close()


if __name__ == "__main__":
    main()
