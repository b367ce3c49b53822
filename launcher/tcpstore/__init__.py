"""torch's TCPStore wire protocol in pure Python: a client and a one-thread server, standard library only.

Wire-compatible with `torch.distributed.TCPStore` (checked against torch 2.13 and 2.4.1, both its libuv and
its legacy server): torch's client works against `StoreServer`, and `StoreClient` against torch's
server. It lets the agent meet the other nodes, and serve its workers' bootstrap store, without
importing torch. `wire`: the ops, frames, limits and request parser; `client`: the client;
`ops`: what each op does to the store's state; `server`: the event loop and its resource limits
(docs/store.md).
"""

from .client import PROBES, StoreClient, StoreError, StoreRestarted, StoreTimeout
from .ops import GRACE
from .server import StoreServer
from .wire import CHANGED, GONE, MAGIC, MAX_FRAME, MAX_KEY, MAX_KEYS, MAX_VALUE, SESSION

__all__ = [
    "CHANGED",
    "GONE",
    "GRACE",
    "MAGIC",
    "MAX_FRAME",
    "MAX_KEY",
    "MAX_KEYS",
    "MAX_VALUE",
    "PROBES",
    "SESSION",
    "StoreClient",
    "StoreError",
    "StoreRestarted",
    "StoreServer",
    "StoreTimeout",
]
