"""Free ports for the tests' stores, etcd members and torchrun runs: the launcher's own picker, below the
kernel's ephemeral range. A port `bind(0)` hands out lies in that range, where an outgoing connection of
any of the ~600 processes a suite run starts may take it before the test's server binds it (CI: etcd
failed with "address already in use"); below it only another explicit bind can."""

from __future__ import annotations

from launcher.net import free_port

__all__ = ["free_port"]
