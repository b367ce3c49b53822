"""What a forming round waits for, in one line: logged every few seconds, and the live view's caption.

Who joined of how many, how many are expected back from the last round, who is missing, and how long
until the last call and the join timeout. Only the first ticket names the missing nodes (an O(N) read);
the others count, so a round of N waiting nodes costs O(N) store operations per interval. (A round that
refills lost group ranks says so instead: `losses.Losses.waiting_line`.)
"""

from __future__ import annotations

from .keys import Keys
from .records import Node, descriptor_id, sealed_members
from .store import Store

MISSING_NAMED = 8  # at most this many missing nodes are named in such a line


def nodes_line(
    store: Store,
    keys: Keys,
    node: Node,
    r: int,
    k: int,
    joined: int,
    expected: int,
    last_call_in: float | None,
    deadline_in: float,
) -> str:
    """The line for ticket k of round r (`joined` tickets so far, `expected` back from round r - 1)."""
    line = f"waiting for nodes in round {r}: {joined} joined (min {node.min_nodes}, max {node.max_nodes})"
    if expected:
        line += f", {expected} expected back from round {r - 1}"
        gone = missing(store, keys, r, joined) if k == 1 else []
        if gone:
            more = f" and {len(gone) - MISSING_NAMED} more" if len(gone) > MISSING_NAMED else ""
            line += f"; missing: {', '.join(gone[:MISSING_NAMED])}{more}"
    if last_call_in is not None:
        line += f"; last call in {max(0.0, last_call_in):.0f} s"
    return line + f"; join timeout in {max(0.0, deadline_in):.0f} s"


def missing(store: Store, keys: Keys, r: int, joined: int) -> list[str]:
    """Node ids of round r - 1 that have not joined round r (those whose entries still read well)."""

    def ids(rnd: int, count: int) -> list[str]:
        found = (descriptor_id(store.get(keys.node(rnd, i))) for i in range(1, count + 1))
        return [node_id for node_id in found if node_id is not None]

    here = set(ids(r, joined))
    return [i for i in ids(r - 1, sealed_members(store.get(keys.sealed(r - 1))) or 0) if i not in here]
