"""Network facts about this host: free ports, its name, and the address and interface peers reach it at.

Pure standard library (psutil only inside `interface_of`), so every backend can use it without
loading another backend's store client.
"""

from __future__ import annotations

import errno
import random
import socket
import threading
import time
from collections.abc import Callable

HOLD_S = 60.0  # the longest a port `free_port` picked stays held: a server binds it well within this


def free_port(host: str = "") -> int:
    """A port free on `host`, chosen below the kernel's ephemeral range, and held until its server binds it.

    `host` "" checks every address, as torch's store server binds the wildcard. Outgoing connections
    only ever get ephemeral ports, so below that range only an explicit bind can take the port. The hold
    (`_hold`, until `release_holds`, `HOLD_S` at most) keeps other pickers off it meanwhile: worker rank 0
    binds MASTER_PORT only after importing torch (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), and another
    job's launcher that picked the same port in those seconds served its store there: each job's workers
    then met in the other's.
    """
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    now = time.monotonic()
    _release(lambda port, until: until <= now)  # a pick nobody let go of (a test's, a tool's) after HOLD_S
    candidates = random.sample(range(20000, max(low, 20001)), k=min(64, max(low - 20000, 1)))
    for port in candidates:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))  # without SO_REUSEADDR: fails beside any socket bound there, a hold too
            except OSError:
                continue
        if _hold(family, host, port):
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:  # everything below the range is taken
        s.bind((host, 0))
        return s.getsockname()[1]


_holds: dict[int, tuple[socket.socket, float]] = {}  # port -> (its hold, when it ends)
_holds_lock = threading.Lock()


def _hold(family: int, host: str, port: int) -> bool:
    """Keep `port` from every other `free_port` (of any process) until released: a socket bound to it with
    SO_REUSEADDR, never listening. Each server a picked port is for sets SO_REUSEADDR too (the launcher's
    store, torch's TCPStore, etcd), so it binds and listens beside the hold; `free_port`'s check does not,
    and so passes the port by. False if the port was taken since the check."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        return False
    with _holds_lock:
        _holds[port] = (sock, time.monotonic() + HOLD_S)
    return True


def release_holds(keep: int | None = None) -> None:
    """Let go of every port this process holds but `keep`: its server has bound it, or none ever will."""
    _release(lambda port, until: port != keep)


def _release(which: Callable[[int, float], bool]) -> None:
    """Close the holds `which(port, until)` picks."""
    with _holds_lock:
        for port in [p for p, (_, until) in _holds.items() if which(p, until)]:
            _holds.pop(port)[0].close()


def port_taken(port: int) -> str:
    """Why a process binding every address could not listen on `port` (as worker rank 0 does), or ""."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does: TIME_WAIT is fine
                s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return e.strerror
    return ""


def hostname() -> str:
    return socket.gethostname()


def lookup_form(host: str) -> str | bytes:
    """`host` as handed to getaddrinfo (and so to `socket.create_connection`): an ASCII name as bytes.

    getaddrinfo encodes a str host with the idna codec, whose first use imports encodings.idna and
    stringprep: ~4 ms of CPU in each agent, before its first connection. An ASCII name is its own
    IDNA form, so the bytes look up the same address; a name with other characters keeps the codec.
    """
    return host.encode("ascii") if host.isascii() else host


def is_local_address(host: str) -> bool:
    """True if `host` resolves to an address of this machine (binding it is the proof)."""
    try:
        infos = socket.getaddrinfo(lookup_form(host), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError:
                continue
    return False


def outward_address(host: str, port: int) -> str:
    """The address this node uses to reach `host`: the one its peers can reach it at."""
    try:
        family = socket.getaddrinfo(lookup_form(host), port)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # UDP: picks the route, sends nothing
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(hostname())


def interface_of(addr: str) -> str | None:
    """The network interface that holds `addr`, if it is one of this machine's."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == addr for a in addrs):
            return name
    return None
