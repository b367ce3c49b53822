"""The watcher's heartbeat judge on a scripted store and a fake clock: a slow store is not a dead
neighbour; a neighbour whose counter stands still past the liveness timeout is."""

from __future__ import annotations

import threading

from support.clock import FakeClock

from launcher.rendezvous.keys import Keys
from launcher.rendezvous.watch import RoundWatch
from launcher.spec import Round

INTERVAL, LIVENESS = 1.0, 10.0


class ScriptedStore:
    """A store without capabilities (so the watch runs the heartbeat ring) whose every wait takes
    `INTERVAL + lag` on the fake clock; the neighbour's counter moves every `beat_every` turns (0: never)."""

    def __init__(self, clock: FakeClock, stop: threading.Event, lag: float, beat_every: int, turns: int):
        self.clock, self.stop, self.lag, self.beat_every, self.turns = clock, stop, lag, beat_every, turns
        self.turn = 0

    def clone(self) -> ScriptedStore:
        return self

    def close(self) -> None:
        pass

    def add(self, key: str, amount: int) -> int:
        if amount:  # this node's own heartbeat
            return self.turn
        return self.turn // self.beat_every if self.beat_every else 0

    def wait(self, keys, timeout: float) -> bool:
        self.turn += 1
        self.clock.advance(timeout + self.lag)
        if self.turn >= self.turns:
            self.stop.set()
        return False

    def get(self, key: str) -> bytes | None:
        return None  # the neighbour never said it finished


def watch(lag: float, beat_every: int, turns: int) -> tuple[list[float], FakeClock]:
    """Run the watch of group rank 0 of 2 for `turns` turns; the times at which it judged its neighbour dead."""
    clock, stop = FakeClock(), threading.Event()
    store = ScriptedStore(clock, stop, lag, beat_every, turns)
    deaths: list[float] = []
    rnd = Round("job", 0, 0, 0, 2, 0, 2, "127.0.0.1", 1)
    RoundWatch(
        store,  # type: ignore[arg-type]
        Keys("job"),
        rnd,
        peer=2,
        interval=INTERVAL,
        liveness_timeout=LIVENESS,
        clock=clock,
        ended=lambda st, r: None,  # type: ignore[arg-type,return-value]
        died=lambda st, r, n, right, how: deaths.append(clock()),
    ).run(stop, lambda event: None)
    return deaths, clock


def test_a_frozen_neighbour_is_dead_just_past_the_liveness_timeout():
    deaths, _ = watch(lag=0.0, beat_every=0, turns=15)
    assert deaths and LIVENESS < deaths[0] <= LIVENESS + 2 * INTERVAL


def test_a_store_that_answers_late_is_not_taken_for_a_dead_neighbour():
    # every turn takes 6 s instead of 1 and the neighbour's beats show every third turn (18 s apart):
    # without the store's lag that is 3 s of silence, well inside the 10 s liveness timeout
    deaths, clock = watch(lag=5.0, beat_every=3, turns=12)
    assert deaths == [] and clock() > 5 * LIVENESS


def test_a_dead_neighbour_behind_a_slow_store_is_still_found():
    deaths, _ = watch(lag=5.0, beat_every=0, turns=15)
    assert deaths, "a neighbour that never beats must be judged dead, slow store or not"
