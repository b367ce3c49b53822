"""systemd's sd_notify protocol: READY, STATUS, STOPPING and WATCHDOG over $NOTIFY_SOCKET.

A no-op when the launcher does not run under a systemd unit with `Type=notify`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping


class Notifier:
    """Sends sd_notify datagrams; `tick()` from the supervisor loop pings the watchdog when due."""

    def __init__(self, environ: Mapping[str, str] = os.environ, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        path = environ.get("NOTIFY_SOCKET", "")
        self.address = ("\0" + path[1:]) if path.startswith("@") else path  # '@' = abstract namespace
        self.watchdog = 0.0
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and (not pid or pid == str(os.getpid())):
            self.watchdog = int(usec) / 1e6 / 2  # ping twice per period, as sd_watchdog_enabled advises
        self._next_ping = 0.0
        self._sock: socket.socket | None = None

    def send(self, **fields: object) -> None:
        """One datagram: `send(READY=1, STATUS="running")` → b"READY=1\\nSTATUS=running"."""
        if not self.address:
            return
        message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto(message, self.address)
        except OSError:
            pass  # systemd gone or socket full: never a reason to disturb training

    def tick(self) -> None:
        if self.watchdog and self.clock() >= self._next_ping:
            self._next_ping = self.clock() + self.watchdog
            self.send(WATCHDOG=1)

    def __call__(self, kind: str, fields: dict) -> None:
        """The supervisor's event sink: READY once workers run, STATUS on every change, STOPPING at the end."""
        if kind == "running":
            self.send(
                READY=1,
                STATUS=f"round {fields['round']}: {fields['workers']} workers running, {fields['restarts']} restart(s)",
            )
        elif kind == "rendezvous":
            self.send(STATUS=f"waiting for round (cause: {fields['cause']})")
        elif kind == "stopping":
            self.send(STATUS=f"stopping workers: {fields['reason']}")
        elif kind == "finished":
            self.send(STOPPING=1, STATUS=f"finished: exit code {fields['exit_code']}")
