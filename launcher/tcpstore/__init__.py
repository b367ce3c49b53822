"""torch's TCPStore wire protocol in pure Python (being split into wire, client and server)."""

from .server import *  # noqa: F403
