"""Free loopback ports for the tests' stores, etcd members and torchrun runs."""

from __future__ import annotations

from launcher.net import free_port as _below_ephemeral


def free_port() -> int:
    """A port free right now, below the kernel's ephemeral range (the launcher's own picker).

    A port the kernel hands out for `bind(0)` sits in the ephemeral range, where any outgoing
    connection of the ~600 processes a suite run starts may take it before the test's server binds
    it (CI: etcd failed with "address already in use"); below that range only another explicit bind can.
    """
    return _below_ephemeral()
