"""--recovery in-place: a killed worker is replaced alone, the survivors keep their processes and
state, at most the step in flight is done again; and a recovery that cannot finish falls back to
restarting the group."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from support.launcher_runs import Launch
from support.paths import ROOT, WORKERS

EXAMPLE = str(ROOT / "examples" / "train_in_place.py")


def events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(240)
def test_killed_worker_is_replaced_alone(tmp_path):
    ev = tmp_path / "events.jsonl"
    launch = Launch()
    try:
        agent = launch.start(
            "--nproc_per_node", "4", "--recovery", "in-place", "--max_restarts", "2", "--events_file", str(ev),
            "--preload", EXAMPLE, "--steps", "80", "--step-time", "0.05",
        )  # fmt: skip
        out = []
        for line in agent.stdout:  # rank 0 says step 50: kill rank 2 mid-run
            out.append(line)
            if "step 50/80" in line:
                break
        victim = next(e["pid"] for e in events(ev) if e["event"] == "spawn" and e["rank"] == 2)
        os.kill(victim, signal.SIGKILL)
        rest, err = agent.communicate(timeout=200)
        out = "".join(out) + rest
    finally:
        launch.cleanup()
    assert agent.returncode == 0, out + err
    log = events(ev)
    first = {e["rank"]: e["pid"] for e in log if e["event"] == "spawn" and e["round"] == 0}
    killed = next(i for i, e in enumerate(log) if e["event"] == "exit" and e["pid"] == victim)
    later = [e for e in log[killed:] if e["event"] == "spawn"]
    assert [e["rank"] for e in later] == [2], later  # the killed rank's replacement, nobody else
    assert not any(e["event"] == "stopping" for e in log), "the survivors were stopped"
    exits = {e["rank"]: (e["pid"], e["returncode"]) for e in log[killed + 1 :] if e["event"] == "exit"}
    assert exits == {0: (first[0], 0), 1: (first[1], 0), 2: (later[0]["pid"], 0), 3: (first[3], 0)}
    assert any(e["event"] == "recovered" and e["ranks"] == [2] for e in log)
    assert "recovering in place: round 1 (1 of 2 restarts used), starting rank 2" in err
    goodput = next(e for e in log if e["event"] == "goodput")["node"]
    assert goodput["steps_known"] and goodput["redone_steps"] <= 1, goodput
    assert goodput["restarts"] == 1
    sums = set(re.findall(r"weights checksum (\S+)", out))
    assert len(re.findall(r"weights checksum", out)) == 4 and len(sums) == 1, out  # the replacement too
    assert re.search(r"\[rank2\]: rank 2: recovered in place in round 1 .*received the state", out), out
    assert "rank 2: a replacement in round 1; the state comes from a survivor" in out, out  # job.joining
    assert "a replacement in round 0" not in out, out


@pytest.mark.timeout(120)
def test_recovery_that_cannot_finish_restarts_the_group(tmp_path):
    ev = tmp_path / "events.jsonl"
    launch = Launch()
    try:
        r = launch.run(
            "--nproc_per_node", "3", "--recovery", "in-place", "--in_place_timeout", "2", "--max_restarts", "1",
            "--events_file", str(ev), str(WORKERS / "in_place_stall.py"), timeout=100,
        )  # fmt: skip
    finally:
        launch.cleanup()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "did not finish within 2 s (--in_place_timeout); restarting the group" in r.stderr
    kinds = [e["event"] for e in events(ev)]
    assert kinds.count("in_place_failed") == 1 and "recovered" not in kinds
    rounds = [e for e in events(ev) if e["event"] == "running"]
    assert [(e["round"], e["restarts"]) for e in rounds] == [
        (0, 0),
        (1, 1),
        (2, 1),
    ]  # the fall-back is not charged again
    assert "job succeeded after 1 restart(s)" in r.stderr


@pytest.mark.timeout(150)
def test_a_hang_is_one_group_restart_not_a_survivor_replaced(tmp_path):
    """The ranks blocked in the all-reduce on a hung rank go silent with it: in place cannot tell them
    apart, so the launcher restarts the group once (never replaces a rank that was only waiting)."""
    ev, steps = tmp_path / "events.jsonl", tmp_path / "steps"
    steps.mkdir()
    launch = Launch()
    try:
        r = launch.run(
            "--nproc_per_node", "3", "--recovery", "in-place", "--preload", "--hang_timeout", "3",
            "--max_restarts", "1", "--events_file", str(ev), str(WORKERS / "in_place_steps.py"), timeout=130,
            env={"STEPS": "12", "STEP_LOG": str(steps), "HANG_AT": "1 5"},
        )  # fmt: skip
    finally:
        launch.cleanup()
    assert r.returncode == 0, r.stdout + r.stderr
    log = events(ev)
    declined = [e["reason"] for e in log if e["event"] == "in_place_declined"]
    assert declined == ["several ranks went silent at once (a hang, and the ranks waiting on it)"], r.stderr
    assert [(e["round"], e["restarts"]) for e in log if e["event"] == "running"] == [(0, 0), (1, 1)]
    assert "recovered" not in [e["event"] for e in log]
    assert r.stdout.count("done rank=") == 3, r.stdout


@pytest.mark.timeout(150)
def test_survivors_waiting_on_a_slow_replacement_are_not_hung(tmp_path):
    """While an in-place recovery is under way its survivors wait, silent, for the replacement: the hang
    clock stops for them (--in_place_timeout bounds the wait) and restarts when the recovery ends."""
    ev, steps = tmp_path / "events.jsonl", tmp_path / "steps"
    steps.mkdir()
    launch = Launch()
    try:
        agent = launch.start(
            "--nproc_per_node", "3", "--recovery", "in-place", "--preload", "--hang_timeout", "2",
            "--max_restarts", "1", "--events_file", str(ev), str(WORKERS / "in_place_steps.py"),
            env={"STEPS": "60", "STEP_LOG": str(steps), "JOIN_DELAY": "4"},
        )  # fmt: skip
        for line in agent.stdout:
            if line.startswith("[rank0]: start"):
                break
        victim = next(e["pid"] for e in events(ev) if e["event"] == "spawn" and e["rank"] == 2)
        os.kill(victim, signal.SIGKILL)
        out, err = agent.communicate(timeout=120)
    finally:
        launch.cleanup()
    assert agent.returncode == 0, out + err
    kinds = [e["event"] for e in events(ev)]
    assert "hang" not in kinds and "in_place_declined" not in kinds, err
    assert kinds.count("recovered") == 1, err
