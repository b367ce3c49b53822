"""The rendezvous protocol on a real TCPStore: clients and `ElasticRendezvous` nodes in this process."""

from __future__ import annotations

from launcher.rendezvous.settings import RendezvousSettings

SETTINGS = RendezvousSettings(join_timeout=10, last_call_timeout=0.5, read_timeout=2)


def serve_store():
    """A real TCPStore server (the one the agents host), on a free loopback port; `.port`, `.close()`."""
    from launcher.rendezvous.c10d import serve
    from support.ports import free_port

    return serve("127.0.0.1", free_port())


def client(port: int):
    """A rendezvous store client on the store at `port`."""
    from launcher.rendezvous.c10d import TCPStoreAdapter

    return TCPStoreAdapter("127.0.0.1", port, SETTINGS.read_timeout, connect_timeout=20)


def agents(port: int, n: int, lo: int, hi: int, run_id: str = "job", settings: RendezvousSettings = SETTINGS) -> list:
    """`n` ElasticRendezvous nodes (nproc 2, --nnodes lo:hi) on the store at `port`."""
    from launcher.rendezvous.protocol import ElasticRendezvous
    from launcher.rendezvous.records import Node

    return [
        ElasticRendezvous(
            client(port),
            run_id,
            Node(node_id=f"n{i}", addr="127.0.0.1", nproc=2, min_nodes=lo, max_nodes=hi, max_restarts=3),
            settings,
            port_picker=lambda: 23456,
        )
        for i in range(n)
    ]
