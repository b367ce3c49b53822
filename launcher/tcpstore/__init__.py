"""torch's TCPStore wire protocol in pure Python: a client and a one-thread server, standard library only.

Wire-compatible with `torch.distributed.TCPStore` (checked against torch 2.13 and 2.4.1, both its libuv and
its legacy server): torch's client works against `StoreServer`, and `StoreClient` against torch's
server. It lets the agent meet the other nodes, and serve its workers' bootstrap store, without
importing torch. `wire`: the ops, frames, limits and request parser; `client`: the client;
`ops`: what each op does to the store's state; `server`: the event loop and its resource limits
(docs/store.md).
"""

from __future__ import annotations

import importlib

# Each name from the module that defines it, imported on first use: the agent that only serves its
# workers' bootstrap store never loads the client (PEP 562; every name stays importable from here).
_WHERE = {
    "PROBES": "client",
    "StoreClient": "client",
    "StoreError": "client",
    "StoreRestarted": "client",
    "StoreTimeout": "client",
    "GRACE": "ops",
    "StoreServer": "server",
    "CHANGED": "wire",
    "GONE": "wire",
    "MAGIC": "wire",
    "MAX_FRAME": "wire",
    "MAX_KEY": "wire",
    "MAX_KEYS": "wire",
    "MAX_VALUE": "wire",
    "SESSION": "wire",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
