"""What a test may see inside a running StoreServer: which keys a request waits on, so a test can
act once a client's WAIT or WAIT_CHANGE has reached the server instead of sleeping."""

from __future__ import annotations


def waiting_on(server, key: str) -> bool:
    """Whether `server` holds a connection waiting for `key` to be set (WAIT, WAIT_CHANGE's change key)
    or to go (WAIT_CHANGE's alive key)."""
    # the clients (torch's and ours) send every key with a leading "/"; a dict lookup from the test's
    # thread while the server's thread writes is atomic under the GIL
    k = ("/" + key).encode()
    return bool(server._waiters.get(k)) or bool(server._gone_waiters.get(k))
