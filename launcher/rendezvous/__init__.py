"""How nodes meet: a small handler interface and one module per backend."""

from .api import Cause, RendezvousHandler, create_rendezvous

__all__ = ["Cause", "RendezvousHandler", "create_rendezvous"]
