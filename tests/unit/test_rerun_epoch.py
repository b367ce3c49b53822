"""`rendezvous.rerun`: a job id run again on a store that kept a dead run's keys starts a new epoch, on a
store that tells a crashed agent (Capability.CRASH); a live job, a fresh one, or another store keeps its own."""

from __future__ import annotations

import pytest

from launcher.rendezvous.keys import Keys
from launcher.rendezvous.rerun import enter_epoch, job_keys
from launcher.rendezvous.store import Capability


class CrashStore:
    """The few reads and the compare-and-set `enter_epoch` makes, over a dict (alive keys are plain keys)."""

    def __init__(self, data: dict[str, bytes], crash: bool = True):
        self.data = data
        self.capabilities = frozenset({Capability.CRASH} if crash else ())

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def multi_get(self, keys) -> list[bytes | None]:
        return [self.data.get(k) for k in keys]

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        now = self.data.get(key)
        if (now is None and expected == b"") or now == expected:
            self.data[key] = now = desired
        return now


DEAD_AND_CLOSED = {"job/round": b"1", "job/closed": b"it finished", "job/r1/joined": b"2", "job/r0/joined": b"2"}


def enter(store: CrashStore, keys: Keys, max_nodes: int = 2) -> bool:
    raw_epoch, *seen = store.multi_get([keys.epoch_key, keys.round, keys.closed])
    return enter_epoch(store, keys, raw_epoch, seen, max_nodes, sleep=lambda s: None)  # type: ignore[arg-type]


@pytest.mark.parametrize("closed", [True, False])
def test_a_job_with_no_node_alive_starts_a_new_epoch_with_empty_keys(closed):
    sealed = {k: v for k, v in DEAD_AND_CLOSED.items() if k != "job/closed"} | {"job/r0/sealed": b"2:a"}
    data = dict(DEAD_AND_CLOSED) if closed else sealed  # round 1 forms after round 0 sealed; all gone
    store, keys = CrashStore(data), Keys("job")
    assert enter(store, keys)
    assert (keys.epoch, keys.round, keys.closed, keys.alive(0, 1)) == (
        1,
        "job/e1/round",
        "job/e1/closed",
        "job/e1/r0/alive1",
    )
    assert (keys.token, keys.quarantined) == ("job/token", "job/quarantined")  # every epoch's
    assert store.data["job/epoch"] == b"1" and job_keys(store, "job").prefix == "job/e1/"  # type: ignore[arg-type]
    store.data.update({"job/e1/round": b"0", "job/e1/closed": b"it finished", "job/e1/r0/joined": b"2"})
    again = Keys("job")
    assert enter(store, again) and again.epoch == 2  # the rerun's run died too: the next one starts clean again


@pytest.mark.parametrize(
    "alive", ["job/r1/alive2", "job/r0/alive1", "job/sparealive1"], ids=["member", "last-round", "spare"]
)
def test_a_job_with_a_node_alive_is_joined_as_it_is(alive):
    store, keys = CrashStore({**DEAD_AND_CLOSED, "job/spares": b"1", alive: b"1"}), Keys("job")
    assert not enter(store, keys)  # a late node: it learns the job's verdict
    assert keys.epoch == 0 and "job/epoch" not in store.data


def test_a_fresh_job_and_a_store_without_crash_detection_keep_the_first_epoch():
    # A forming round with no sealed one before it proves nothing: a node takes its ticket, then holds.
    for data in ({}, {"job/round": b"0"}, {"job/round": b"0", "job/r0/joined": b"1"}, {"job/round": b"2"}):
        store, keys = CrashStore(data), Keys("job")
        assert not enter(store, keys) and keys.epoch == 0
    store, keys = CrashStore(dict(DEAD_AND_CLOSED), crash=False), Keys("job")  # torch's own server: no held keys
    assert not enter(store, keys) and keys.epoch == 0


def test_two_movers_agree_on_one_new_epoch():
    store = CrashStore(dict(DEAD_AND_CLOSED))
    a, b = Keys("job"), Keys("job")
    raw_epoch, *seen = store.multi_get([a.epoch_key, a.round, a.closed])
    assert enter(store, a) and a.epoch == 1
    assert enter_epoch(store, b, raw_epoch, seen, 2, sleep=lambda s: None) and b.epoch == 1  # type: ignore[arg-type]
