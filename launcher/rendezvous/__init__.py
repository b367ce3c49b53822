"""How nodes meet: a small handler interface, one module per backend, and the table of backends.

`BACKENDS` maps a `--rdzv_backend` name to its settings parser (run once, by `config.from_flags`,
at config time: the settings modules load no store client) and its handler factory (run by
`create_rendezvous`; it imports the backend module, and with it the store client, only then).
The backends import `api`, `protocol` and their settings, never this table.
"""

from __future__ import annotations

from collections.abc import Callable

from .api import Cause, JobParams, RendezvousHandler
from .settings import C10dSettings, Flags, LocalSettings, StaticSettings, parse_c10d, parse_local, parse_static

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from .etcd.settings import EtcdSettings

    Settings = LocalSettings | StaticSettings | C10dSettings | EtcdSettings


class Backend:
    """A backend's settings parser and its handler factory (not a NamedTuple: typing costs a launch ~4 ms)."""

    __slots__ = ("parse", "create")

    def __init__(self, parse: Callable[[Flags], Settings], create: Callable[[Settings, JobParams], RendezvousHandler]):
        self.parse, self.create = parse, create


def _local(settings, job: JobParams) -> RendezvousHandler:
    from .local import LocalRendezvous

    return LocalRendezvous(settings, job)


def _c10d(settings, job: JobParams) -> RendezvousHandler:
    from .c10d import C10dRendezvous

    return C10dRendezvous(settings, job)


def _etcd(settings, job: JobParams) -> RendezvousHandler:
    from .etcd.backend import EtcdRendezvous

    return EtcdRendezvous(settings, job)


def _torch(settings, job: JobParams) -> RendezvousHandler:
    from .torch_adapter import TorchHandlerRendezvous

    return TorchHandlerRendezvous(settings, job)


def _parse_etcd(flags: Flags) -> Settings:
    # Imported only here: the etcd settings (two dataclasses) cost every other launch's start ~2 ms.
    from .etcd.settings import parse_etcd

    return parse_etcd(flags)


def _built_by_config(flags: Flags) -> Settings:
    raise AssertionError("config builds a torchrun.handlers backend's settings itself")


BACKENDS: dict[str, Backend] = {
    "local": Backend(parse_local, _local),
    "static": Backend(parse_static, _local),
    "c10d": Backend(parse_c10d, _c10d),
    "etcd": Backend(_parse_etcd, _etcd),
    "torch": Backend(_built_by_config, _torch),  # a torchrun.handlers plugin (torch_adapter.py)
}


def create_rendezvous(backend: str, settings: Settings, job: JobParams) -> RendezvousHandler:
    """The handler for `--rdzv_backend backend`, given its settings (parsed by `BACKENDS[backend].parse`)
    and the job's general fields."""
    return BACKENDS[backend].create(settings, job)


__all__ = ["BACKENDS", "Backend", "Cause", "Flags", "JobParams", "RendezvousHandler", "Settings", "create_rendezvous"]
