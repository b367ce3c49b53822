"""The store interface the protocol runs on: a handful of required operations and the optional parts a
store declares (`Capability`). Each backend maps them onto its own store (c10d: our TCPStore client;
etcd: `etcd.store`); the protocol and `launcher status` use nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object  # the type checker's; at run time a plain base


class Capability(enum.Enum):
    """An optional part of the `Store` interface; a store lists those it has in `capabilities`."""

    DELETE = "delete"  # `DeletingStore.delete`: old rounds' per-node keys are deleted as the job goes on
    LIVENESS = "liveness"  # `LivenessStore.hold`/`wait_change`: the store knows who is alive (no heartbeat ring)
    CRASH = "crash"  # the same methods tell a crashed agent at once; heartbeats still judge a frozen one


class Change(enum.Enum):
    """What `LivenessStore.wait_change` saw before its timeout."""

    CHANGED = "change"  # the round's `change` key exists
    GONE = "gone"  # the watched `alive` key vanished: its agent died (or finished)


class Store(Protocol):
    """The handful of operations the protocol needs; each backend maps them onto its store.

    The optional parts are declared, not guessed: a store names them in `capabilities`, and
    offers then the methods of `DeletingStore` (DELETE) and `LivenessStore` (LIVENESS). A store
    without a `capabilities` attribute has the required operations only (see `capabilities_of`).
    A wrapper that forwards attributes to a store (a counter in the benchmarks) forwards the
    declaration with them.
    """

    capabilities: frozenset[Capability]

    def add(self, key: str, amount: int) -> int: ...
    def get(self, key: str) -> bytes | None: ...  # None when absent; never blocks
    def set(self, key: str, value: bytes) -> None: ...
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes: ...  # returns the value now
    def wait(self, keys: Sequence[str], timeout: float) -> bool: ...  # True once every key exists
    def wait_get(
        self, key: str, timeout: float
    ) -> bytes | None: ...  # the value once `key` exists; None at the timeout
    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]: ...  # None or b"" when absent; never blocks
    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None: ...
    def clone(self) -> Store: ...  # a second connection, for the watcher thread
    def close(self) -> None: ...


class DeletingStore(Store, Protocol):
    """A store with `Capability.DELETE`."""

    def delete(self, keys: Sequence[str]) -> None: ...


class LivenessStore(Store, Protocol):
    """A store with `Capability.LIVENESS` (it knows which agents are alive: etcd, a lease each) or
    `Capability.CRASH` (it knows which agents' processes are gone: our TCPStore server's held keys)."""

    def hold(self, key: str) -> None:
        """`key` exists for as long as this agent lives."""

    def wait_change(self, change: str, alive: str | None, timeout: float) -> Change | None:
        """CHANGED once `change` exists, GONE once `alive` is absent (never when it is None), None at
        the timeout. LIVENESS: store trouble counts as a timeout; CRASH: it raises, as `wait` does."""


HELD = frozenset({Capability.LIVENESS, Capability.CRASH})  # the stores that `hold` an alive key per member


def any_set(store: Store, keys: Sequence[str], chunk: int = 16) -> bool:
    """Whether any of `keys` is set: read `chunk` at a time, stopping at the first set (a live job's
    first members hold their alive keys, so a look at a live job costs one request)."""
    return any(any(store.multi_get(keys[at : at + chunk])) for at in range(0, len(keys), chunk))


def capabilities_of(store: Store) -> frozenset[Capability]:
    """The optional parts `store` declares; none when it declares nothing."""
    return frozenset(getattr(store, "capabilities", ()))
