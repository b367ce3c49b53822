"""The c10d backend: the protocol on torch's TCPStore (the only place the agent imports torch).

The store binds exactly the address it was given (torch binds the wildcard): we bind and listen
on a socket ourselves and hand its fd to the TCPStore server. Who hosts: `--rdzv_conf is_host=`
when given, else the node whose own address is the endpoint's (checked by binding it, which is
what counts). `python -m launcher store` runs the store on its own, outside any training node.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import struct
import threading
import warnings
from typing import Sequence

from ..config import DEFAULT_PORTS, LaunchConfig, parse_endpoint
from ..errors import RendezvousConnectionError
from ..process import free_port, hostname
from .protocol import ElasticRendezvous, Node

PREFIX = "launcher/"


def _torch_distributed():
    """Import torch.distributed quietly: no NumPy warning, no C++ log line per store wait timeout."""
    saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"  # store errors reach the user as our one-line messages
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch.distributed as dist
    finally:  # workers must not inherit our quieting
        if saved is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = saved
    return dist


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


# A TCPStore client waits for its answers without any time limit: a frozen store (SIGSTOP), a
# partitioned network or another program on the port would block an agent forever. We bound the
# constructor with a thread and every later answer with SO_RCVTIMEO on the client's socket.
ANSWER_GRACE = 5.0  # beyond read_timeout, the longest a store may take to answer (its own waits included)


class TCPStoreAdapter:
    """The protocol's `Store` operations on one TCPStore client connection."""

    def __init__(self, host: str, port: int, timeout: float, connect_timeout: float | None = None):
        self.host, self.port, self.timeout = host, port, timeout
        self._broken = ""  # after a failed exchange the connection may be out of step: never reuse it
        self._store = _connect(host, port, connect_timeout or timeout, timeout + ANSWER_GRACE)
        self._store.set_timeout(_td(timeout))

    def _call(self, op: str, *args):
        if self._broken or self._store is None:
            raise RendezvousConnectionError(f"rendezvous store at {self.host}:{self.port}: {self._broken or 'connection closed'}")
        try:
            return getattr(self._store, op)(*args)
        except RuntimeError as e:
            if _wait_timeout(e):
                raise
            self._broken = _first_line(e)
            if "socket timeout" in self._broken.lower():
                self._broken = f"no answer within {self.timeout + ANSWER_GRACE:g} s (read_timeout + {ANSWER_GRACE:g} s)"
            raise RendezvousConnectionError(f"rendezvous store at {self.host}:{self.port}: {self._broken}") from None

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", PREFIX + key, amount))

    def get(self, key: str) -> bytes | None:
        k = PREFIX + key
        return self._call("get", k) if self._call("check", [k]) else None

    def set(self, key: str, value: bytes) -> None:
        self._call("set", PREFIX + key, value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._call("compare_set", PREFIX + key, expected, desired)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        try:
            self._call("wait", [PREFIX + k for k in keys], _td(timeout))
            return True
        except RuntimeError as e:
            if _wait_timeout(e):  # the store's own answer; a socket timeout is a lost store
                return False
            raise

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return list(self._call("multi_get", [PREFIX + k for k in keys]))

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        self._call("multi_set", [PREFIX + k for k in keys], list(values))

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._call("delete_key", PREFIX + key)

    def clone(self) -> "TCPStoreAdapter":
        return TCPStoreAdapter(self.host, self.port, self.timeout)

    def close(self) -> None:
        self._store = None


def _wait_timeout(e: BaseException) -> bool:
    """The store answered that a wait ran out (the connection is fine), as opposed to no answer at all."""
    return "wait timeout" in str(e).lower()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _connect(host: str, port: int, connect_timeout: float, answer_timeout: float):
    """A TCPStore client whose every answer must come within `answer_timeout` seconds."""
    dist = _torch_distributed()
    box: dict = {}

    def make() -> None:  # retries until the store answers or connect_timeout passes
        try:
            box["store"] = dist.TCPStore(host, port, is_master=False, timeout=_td(connect_timeout), use_libuv=True)
        except BaseException as e:  # DistNetworkError/DistStoreError derive from RuntimeError
            box["error"] = e

    before = _sockets()
    maker = threading.Thread(target=make, name="launcher-store-connect", daemon=True)
    maker.start()
    maker.join(connect_timeout + answer_timeout)
    if maker.is_alive():
        raise RendezvousConnectionError(
            f"the rendezvous store at {host}:{port} accepted the connection but never answered "
            f"(another program on that port, or a frozen store?)")
    if "error" in box:
        e = box["error"]
        hint = " (another program on that port? it does not speak the c10d store protocol)" if "Ping failed" in str(e) else ""
        raise RendezvousConnectionError(f"cannot reach the rendezvous store at {host}:{port}: {_first_line(e)}{hint}")
    _limit_answers(port, answer_timeout, [fd for fd, inode in _sockets().items() if before.get(fd) != inode])
    return box["store"]


def _sockets() -> dict[int, str]:
    """This process's sockets: file descriptor -> "socket:[inode]"."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found[int(name)] = link
    return found


def _limit_answers(port: int, seconds: float, fds) -> None:
    """Give those of `fds` that are connections to `port` without a receive timeout this one."""
    limit = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    for fd in fds:
        try:
            with socket.socket(fileno=os.dup(fd)) as s:  # options belong to the socket: the dup shares them
                if s.type != socket.SOCK_STREAM or s.getpeername()[1] != port:
                    continue
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        except (OSError, ValueError, IndexError):  # gone meanwhile, not connected, not INET
            continue


def serve(host: str, port: int) -> tuple[object, socket.socket]:
    """Start a TCPStore server bound to `host:port` only; keep both returned objects alive."""
    dist = _torch_distributed()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    server = dist.TCPStore(host, sock.getsockname()[1], is_master=True, wait_for_workers=False,
                           master_listen_fd=sock.fileno(), use_libuv=True)
    return server, sock


def is_local_address(host: str) -> bool:
    """True if `host` resolves to an address of this machine (binding it is the proof)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
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
        family = socket.getaddrinfo(host, port)[0][0]
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


class C10dRendezvous(ElasticRendezvous):
    """ElasticRendezvous on a TCPStore, hosting the store here when this node is the endpoint."""

    def __init__(self, config: LaunchConfig):
        host, port = parse_endpoint(config.rdzv_endpoint, DEFAULT_PORTS["c10d"])
        s = config.rdzv
        self.server = None
        wants_host = s.is_host if s.is_host is not None else is_local_address(host)
        if wants_host:
            try:
                self.server = serve(host, port)
            except OSError:
                if s.is_host:
                    raise RendezvousConnectionError(f"cannot host the rendezvous store on {host}:{port}: port taken") from None
                # another agent on this machine hosts it already: be a client
        store = TCPStoreAdapter(host, port, s.read_timeout, connect_timeout=s.join_timeout)
        addr = config.local_addr or outward_address(host, port)
        node = Node(
            node_id=f"{hostname()}:{os.getpid()}",
            addr=addr,
            ifname=interface_of(addr),
            nproc=config.nproc_per_node,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            max_restarts=config.max_restarts,
            token=config.join_token,
        )
        super().__init__(store, config.run_id, node, s, port_picker=free_port, is_host=self.server is not None)

    def shutdown(self, succeeded: bool) -> None:
        """Leave the job, then drop the connection and the store server in order (no C++ teardown races)."""
        super().shutdown(succeeded)
        self.store.close()
        self.server = None


def store_main(host: str, port: int) -> int:
    """`python -m launcher store`: serve a rendezvous store until SIGTERM or SIGINT."""
    server = serve(host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(f"launcher store: serving on {host}:{port}", flush=True)
    stop.wait()
    del server
    return 0
