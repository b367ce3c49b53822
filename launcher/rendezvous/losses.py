"""Losing a member: one rule for a node that died and one that left (docs/spares.md).

The node that tells (the dead node's left-hand neighbour, or the leaving node itself) records why under
`r<r>/lost<g>` and counts it in `r<r>/left`. When the members left are fewer than MIN, one restart is
charged to the job's budget, through the round's `failed` counter, so a loss and the worker failures it
causes cost one restart together; with none left, the job closes with the reason. An elastic job that
stays at MIN or above re-forms free of charge. The next round then waits at most `replace_timeout` for
replacements (a spare, a node requeued by Slurm or started by hand), saying which group ranks it waits to
fill and why they were lost, and past it closes the job with that reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..spec import Round
from .api import FINISHED, budget_spent
from .keys import Keys
from .records import Node, sealed_members
from .spares import drop
from .store import Store

log = logging.getLogger(__name__)
LOST_TEXT = 300  # a loss reason is kept to this many characters


class Losses:
    """The loss rule for this node's job; `close(reason, store)` closes the job, `change(r, reason, store)`
    ends round r (the protocol's own steps)."""

    def __init__(
        self,
        keys: Keys,
        node: Node,
        close: Callable[[str, Store], str],
        change: Callable[[int, str, Store], None],
    ):
        self.keys = keys
        self.node = node
        self.close = close
        self.change = change

    def lost(self, st: Store, r: int, n: int, g: int, why: str) -> None:
        """Group rank g of round r (n members) is lost, because `why`."""
        k, node = self.keys, self.node
        if st.add(k.told(r, g), 1) != 1:  # told already (by its neighbour, a spare, itself): counted once
            self.change(r, why, st)
            return
        st.set(k.lost(r, g), why[:LOST_TEXT].encode())
        left = st.add(k.left(r), 1)
        if self._finished(st, r, n, left):  # the others finished: it was lost as they did (SPMD ranks end together)
            self.change(r, why, st)
            return
        charge = n - left < node.min_nodes and st.add(k.failed(r), 1) == 1
        if charge and budget_spent(st.add(k.restarts, 1), node.max_restarts):
            self.close(
                f"{why}; {n - left} node(s) left, fewer than {node.min_nodes}, and no restart left to replace it "
                f"(--max_restarts {node.max_restarts})",
                st,
            )
        self.change(r, why, st)

    def finish(self, st: Store, r: int, n: int) -> bool:
        """A member of round r (n members) finished: True when it was the last, and the job is closed as
        finished. A member lost after another finished counts as finished (`lost`)."""
        done = st.add(self.keys.finished(r), 1)  # counted before `left` is read
        return self._finished(st, r, n, st.add(self.keys.left(r), 0), done)

    def _finished(self, st: Store, r: int, n: int, left: int, done: int | None = None) -> bool:
        """Close the job as finished when some member of round r finished and every other one finished
        too or was lost: SPMD ranks exit 0 only past their last collective, so the others were past theirs
        too, and a member lost then (died, stopped, quarantined) was lost in teardown. Each side counts
        itself before it reads the other, so one of them sees both."""
        done = st.add(self.keys.finished(r), 0) if done is None else done
        if not done or done + left < n:
            return False
        lost = f"; {left} lost as the others finished" if left else ""
        self.close(f"{FINISHED} (round {r} ended on all {n} nodes{lost})", st)
        return True

    def all_lost(self, st: Store, r: int, n: int, spare: str) -> None:
        """Every member of round r (n of them) is gone, as `spare` found: nobody else is left to tell."""
        why = f"every node of round {r} was lost (their alive keys gone or heartbeats stopped; found by spare {spare})"
        for g in range(n):
            self.lost(st, r, n, g, why)

    def left_forming(self, st: Store, forming: tuple[int, int], last: Round | None, why: str) -> None:
        """This node leaves while it holds ticket k of forming round r, because `why` (said in one line;
        empty: it finished, quietly): its alive key goes (the sealer leaves it out; sealed already, its
        neighbour sees it gone). `last`: the round it was a member of; if that was r - 1, it is lost from it."""
        r, k = forming
        if why:
            log.info(f"left round {r} while it formed ({why})")
        drop(st, [self.keys.alive(r, k)])
        if why and last is not None and last.round == r - 1:
            gone = f"{self.node.node_id} left: {why}"
            self.lost(st, last.round, last.group_world_size, last.group_rank, gone)

    def refilling(self, st: Store, r: int) -> bool:
        """Round r - 1 lost members and left fewer than MIN: round r waits for replacements (3 reads)."""
        prev = sealed_members(st.get(self.keys.sealed(r - 1))) if r > 0 else None
        if not prev:
            return False
        left = st.add(self.keys.left(r - 1), 0)
        return left > 0 and prev - st.add(self.keys.dead(r - 1), 0) - left < self.node.min_nodes

    def reasons(self, st: Store, r: int) -> dict[int, str]:
        """Group rank -> why it was lost in round r: O(N) reads, for the first ticket's line and the close."""
        n = sealed_members(st.get(self.keys.sealed(r))) or 0
        raws = st.multi_get([self.keys.lost(r, g) for g in range(n)]) if n else []
        return {g: raw.decode(errors="replace") for g, raw in enumerate(raws) if raw}

    def waiting_line(self, st: Store, r: int, k: int, joined: int, left_s: float) -> str:
        """What round r waits for while it refills (only the first ticket reads and names the ranks)."""
        lost = self.reasons(st, r - 1) if k == 1 else {}
        what = f"group rank {', '.join(map(str, sorted(lost)))}" if lost else "the lost group ranks"
        why = f" ({'; '.join(dict.fromkeys(lost.values()))})" if lost else ""
        return (
            f"waiting for a node to fill {what} in round {r}{why}: {joined} joined of {self.node.min_nodes}; "
            f"no spare at hand; replace timeout in {max(0.0, left_s):.0f} s"
        )

    def no_replacement(self, st: Store, r: int, timeout: float) -> str:
        """Why the job closes when round r got no replacement within `timeout`."""
        lost = self.reasons(st, r - 1)
        return (
            f"no node came to fill group rank {', '.join(map(str, sorted(lost))) or '?'} within {timeout:g} s "
            f"(replace_timeout) after {'; '.join(dict.fromkeys(lost.values())) or 'a loss'}"
        )
