"""A job id run again on a store that kept a dead run's keys starts clean: a new epoch of the job.

`launcher store` outlives its jobs, and a Slurm requeue keeps its job id: the dead run's keys (a
sealed round, a `closed` mark) would make the new run's nodes spares of a round nobody is left to
end, or refuse them with the old verdict. etcd sweeps a job whose agents are all gone
(`etcd.store`); on a store with `Capability.CRASH` (our TCPStore server: a held key vanishes with
its agent's connections) the first node of the new run does the same in its own way: when the job
closed or sealed a round, and every alive key of its last two rounds and of its spares is gone, it
moves the job to the next epoch (`<run_id>/epoch`, by compare-and-set: one mover), whose keys start
empty (`keys.Keys`).

A late node of a live job (some member's key held) joins that job as before, and learns its
verdict when it is closed. A store without CRASH (torch's own TCPStore server: no held keys) keeps
every run in epoch 0: a rerun there needs a new id or a fresh store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .keys import Keys
from .store import Capability, Store, any_set, capabilities_of

log = logging.getLogger(__name__)
SETTLE = 1.0  # seconds between the two looks that must both find the job dead (a node may be between steps)
MAX_SPARES_READ = 1024  # the most recent spares whose alive keys are read


def _number(raw: bytes | None) -> int:
    """A counter or epoch as the store holds it; 0 when absent or not ours (a hostile value)."""
    return int(raw) if raw and raw.isdigit() and len(raw) <= 9 else 0


def enter_epoch(
    store: Store,
    keys: Keys,
    raw_epoch: bytes | None,
    seen: list[bytes | None],
    max_nodes: int,
    sleep: Callable[[float], object] = time.sleep,
) -> bool:
    """Move `keys` to the job's epoch (`raw_epoch`, read with the round and `closed` mark in `seen`); first
    start a new one when the last run is over and no node of it lives (stores with CRASH only). True when
    the keys moved: the caller's reads of the round and `closed` are then stale."""
    keys.rebase(_number(raw_epoch))
    moved = keys.epoch != 0
    if Capability.CRASH not in capabilities_of(store):
        return moved
    first = _last_run(store, keys, max_nodes, store.multi_get([keys.round, keys.closed]) if moved else seen)
    if first is None:
        return moved
    sleep(SETTLE)  # a node of a live job may hold no key for a moment (it took a ticket, holds next)
    if _last_run(store, keys, max_nodes, store.multi_get([keys.round, keys.closed])) != first:
        return moved
    now = store.compare_set(keys.epoch_key, raw_epoch or b"", str(keys.epoch + 1).encode())
    keys.rebase(_number(now))
    closed = ", closed" if first[1] else ""
    log.info(f"no node of job {keys.run_id!r}'s last run is alive (round {first[0]}{closed}): it starts clean")
    return True


def _last_run(
    store: Store, keys: Keys, max_nodes: int, seen: list[bytes | None]
) -> tuple[int, bool, int, int, int] | None:
    """The job's state (round, closed, tickets of its last two rounds, spares) when it ran before and none
    of its nodes holds an alive key now; None when it never ran, or some node of it lives. `seen`: the
    job's round and `closed` mark, as just read."""
    raw_round, closed = seen
    if not raw_round:
        return None  # never ran here (or its first node is creating the round counter)
    r = _number(raw_round)
    rounds = [r, r - 1] if r > 0 else [r]
    values = store.multi_get([keys.joined(q) for q in rounds] + [keys.sealed(q) for q in rounds] + [keys.spares])
    tickets, seals, spares = [_number(c) for c in values[: len(rounds)]], values[len(rounds) : -1], _number(values[-1])
    # Only a closed job or a sealed round is judged: every member of a sealed round holds its key, and the
    # nodes forming the round after it still hold theirs of it. A round forming with no sealed one before
    # it proves nothing (a node takes its ticket, then holds its key); its sealer leaves dead tickets out.
    if not closed and not any(seals):
        return None
    alive = [keys.alive(q, k) for q, n in zip(rounds, tickets) for k in range(1, min(n, max_nodes) + 1)]
    alive += [keys.spare_alive(j) for j in range(max(1, spares - MAX_SPARES_READ + 1), spares + 1)]
    if any_set(store, alive):
        return None
    return (r, bool(closed), *(tickets + [0])[:2], spares)


def job_keys(store: Store, run_id: str) -> Keys:
    """The keys of job `run_id` in its current epoch, for a reader beside the protocol (the job board,
    the goodput accounts, `launcher status`)."""
    return Keys(run_id, _number(store.get(Keys(run_id).epoch_key)))
