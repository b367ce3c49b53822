"""Network facts about this host: free ports, its name, and the address and interface peers reach it at.

Pure standard library (psutil only inside `interface_of`), so every backend can use it without
loading another backend's store client.
"""

from __future__ import annotations

import errno
import random
import socket


def free_port(host: str = "") -> int:
    """A port free on `host`, chosen below the kernel's ephemeral range.

    `host` "" checks every address, as torch's store server binds the wildcard. Outgoing
    connections only ever get ephemeral ports, so a port below that range can be
    taken between this check and the worker's bind only by another explicit bind: as
    race-safe as the OS allows without holding the socket open.
    """
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = random.sample(range(20000, max(low, 20001)), k=min(64, max(low - 20000, 1)))
    for port in candidates:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:  # everything below the range is taken
        s.bind((host, 0))
        return s.getsockname()[1]


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
