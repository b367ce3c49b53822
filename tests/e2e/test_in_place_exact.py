"""--recovery in-place changes nothing the job computes: after a lost rank, wherever in a step or in
the job it was lost, the final weights (and each rank's batch-norm buffers) equal an undisturbed
run's bit for bit, every step is applied once per rank, and every sample of an epoch is used once.

tests/workers/in_place_exact.py trains 3 ranks of DDP with Dropout and BatchNorm (per-rank random
streams, re-seeded per epoch) over a DataLoader with a DistributedSampler (or torchdata's
StatefulDataLoader over it), with a logged loss
all_reduce after the optimizer step; each process logs the steps it applied and their sample ids.
The workers are forked from the --preload zygote (torch imported once, not once per process: the
suite's time), the undisturbed runs' too. A spawned replacement is held to the same weights by
test_examples (the demo in place, spawned) and test_in_place_keys (its rounds, spawned).
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.launcher_runs import Launch
from support.paths import WORKERS
from support.step_logs import read_step_logs

STEPS = 24  # 2 epochs of 12 batches per rank
WORLD = 3


@dataclass(frozen=True)
class Outcome:
    """What one run computed, read from its step logs and events file."""

    returncode: int
    finals: dict[int, set[tuple[int, str, str]]]  # rank -> {(steps, weights, buffers)} of its final processes
    applied: dict[int, list[int]]  # rank -> the steps its processes applied, in all
    ids: collections.Counter  # sample id -> how many times a step applied it, over the ranks
    restarts: int
    events: list[dict]
    err: str


def run(tmp: Path, restarts: int = 2, **env: str) -> Outcome:
    logs = tmp / "steps"
    logs.mkdir(parents=True)
    launch = Launch(preload=True)
    try:
        r = launch.run(
            "--nproc_per_node", str(WORLD), "--recovery", "in-place", "--max_restarts", str(restarts),
            "--events_file", str(tmp / "events.jsonl"), str(WORKERS / "in_place_exact.py"),
            env={"STEP_LOG": str(logs), **env}, timeout=150,
        )  # fmt: skip
    finally:
        launch.cleanup()
    finals, applied, ids = read_step_logs(logs)
    events = [json.loads(line) for line in (tmp / "events.jsonl").read_text().splitlines()]
    restarts = max((e["restarts"] for e in events if e["event"] == "running"), default=0)
    return Outcome(r.returncode, finals, applied, ids, restarts, events, r.stderr)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> dict[str, Outcome]:
    """The same jobs run with no fault: what every disturbed run must end with."""
    out = {}
    for name, env in (("loader", {}), ("flat", {"FLAT": "1"})):
        ref = run(tmp_path_factory.mktemp(f"undisturbed-{name}"), **env)
        assert ref.returncode == 0 and ref.restarts == 0, ref.err
        out[name] = ref
    return out


def assert_exact(got: Outcome, ref: Outcome, restarts: int = 1) -> None:
    assert got.returncode == 0, got.err
    assert got.restarts == restarts, got.err
    assert got.finals == ref.finals, f"the weights differ from the undisturbed run's\n{got.err}"
    for rank, steps in got.applied.items():  # a lost rank's steps and its replacement's, together
        assert sorted(steps) == list(range(STEPS)), f"rank {rank} applied {sorted(steps)}"
    assert got.ids == ref.ids  # every sample of each epoch used once, by the same ranks' steps


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "case, die",
    [
        ("flat", "1 5 after"),  # after the optimizer step, before the loss all_reduce: was applied twice
        # One job, three recoveries (each a few seconds; a job each cost a zygote and a torch import):
        # mid-epoch before the commit (the step again, its dropout as before), the epoch's last batch
        # committed (the next epoch, its own shuffle), and after the last step (the job finishes
        # without running again), with a kept module no parameter of which is trained (a fine-tune's)
        ("frozen", "1 5 before, 2 11 after, 0 23 end"),
        # torchdata's StatefulDataLoader: a rank lost at start-up, before the first step (one restart, no
        # wait: the others join the newest round); one resumed from the loader's state_dict, the
        # DataLoader's batches, so its weights; then the sender's rank lost: the replacement takes a
        # survivor's loader state
        ("stateful", "2 0 start, 1 5 before, 0 16 after"),
    ],
)
def test_a_rank_lost_in_a_step_leaves_the_weights_as_an_undisturbed_run(tmp_path, undisturbed, case, die):
    faults = [int(entry.split()[0]) for entry in die.split(",")]
    env = {"DIE_AT": die, **({"FLAT": "1"} if case == "flat" else {case.upper(): "1"})}
    got = run(tmp_path, restarts=len(faults) + 1, **env)
    assert_exact(got, undisturbed["flat" if case == "flat" else "loader"], restarts=len(faults))
    spawns = [(e["round"], e["rank"]) for e in got.events if e["event"] == "spawn" and e["round"] > 0]
    assert spawns == [(n, rank) for n, rank in enumerate(faults, 1)], spawns  # each lost rank alone, in turn
    kinds = [e["event"] for e in got.events]
    assert "in_place_failed" not in kinds and "in_place_declined" not in kinds, got.err


@pytest.mark.timeout(300)
def test_two_ranks_lost_within_100_ms_are_one_recovery_and_one_restart(tmp_path, undisturbed):
    got = run(tmp_path, DIE_AT="1 5 after", DIE_TOO="2 0.05")
    assert_exact(got, undisturbed["loader"])
    # the second lands before or after rank 1's round was taken: replaced in that round or the one after it
    spawned = sorted(e["rank"] for e in got.events if e["event"] == "spawn" and e["round"] > 0)
    assert spawned == [1, 2], got.err


@pytest.mark.timeout(300)
def test_a_peer_lost_outside_a_step_is_one_group_restart_in_one_line(tmp_path, undisturbed):
    got = run(tmp_path, DIE_AT="1 0 eval")
    assert got.returncode == 0 and got.restarts == 1, got.err
    assert got.finals == undisturbed["loader"].finals, got.err  # the group ran again from the start: the same
    assert got.err.count("a peer was lost outside `with step:`") >= 1, got.err
    assert "Traceback" not in got.err, got.err


@pytest.mark.timeout(300)
def test_a_fault_during_a_recovery_costs_one_more_restart_said_in_one_line_and_stays_exact(tmp_path, undisturbed):
    """Rank 2 dies 2 s after rank 1, while rank 1's replacement is still starting (it waits 4 s): the
    recovery goes on in place in the round after, one more restart, and nothing it computes changes."""
    got = run(tmp_path, restarts=3, DIE_AT="1 5 after", DIE_TOO="2 2.0", JOIN_DELAY="4")
    assert_exact(got, undisturbed["loader"], restarts=2)
    lines = [line for line in got.err.splitlines() if "rank 2 killed by SIGKILL while round 1" in line]
    assert len(lines) == 1 and "recovering in place in the round after it (one more restart)" in lines[0], got.err


@pytest.mark.timeout(300)
def test_a_step_a_replacement_runs_twice_begins_both_times_from_its_predecessors_streams(tmp_path, undisturbed):
    """Rank 1 is lost before its commit; in the step run again, rank 2 is lost too: rank 1's replacement
    runs the step a second time from the streams its predecessor began it with (it took them from its
    own record), not from its own start-up's."""
    got = run(tmp_path, restarts=3, DIE_AT="1 5 before", DIE_REDO="2")
    assert_exact(got, undisturbed["loader"], restarts=2)
