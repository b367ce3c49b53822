"""torchrun's plugin points, found through package metadata (`importlib.metadata`), never by importing.

`torchrun.logs_specs` (a `LogsSpecs` class that places each worker's log files) and `torchrun.handlers`
(a function that makes a torch `RendezvousHandler` from `RendezvousParameters`). Finding one reads the
installed distributions' `entry_points.txt`; loading it (which imports the plugin, and torch with it)
happens only when the job starts, and only for the name given.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from importlib.metadata import EntryPoint


def find(group: str, name: str) -> EntryPoint | None:
    """The entry point `name` in `group`, or None; the first one wins where two packages claim it."""
    # importlib.metadata costs ~10 ms (zipfile, email, csv): only a job that names a plugin pays it
    from importlib import metadata

    for ep in metadata.entry_points(group=group):
        if ep.name == name:
            return ep
    return None


def load(group: str, name: str) -> object:
    """Import and return what the entry point names (a class or a function)."""
    ep = find(group, name)
    if ep is None:
        raise LookupError(f"no {group} entry point is named {name!r}")
    return ep.load()
