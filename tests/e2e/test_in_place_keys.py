"""--recovery in-place, the agent's side against workers that drive the in-place keys as `Job` does
(tests/workers/in_place_keys.py: a store client, no torch): a rank lost after every rank finished the job
costs nothing; a rank lost before entering a round that recovers in place takes its seat there, free; a
worker that cannot go on in place while a recovery is under way restarts the group, free."""

from __future__ import annotations

import json
import re

import pytest
from support.launcher_runs import Cluster, Launch, c10d
from support.paths import WORKERS
from support.ports import free_port

WORKER = str(WORKERS / "in_place_keys.py")


def events(path, kind: str | None = None) -> list[dict]:
    parsed = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in parsed if kind is None or e["event"] == kind]


def run(tmp_path, *flags: str, env: dict) -> tuple:
    ev = tmp_path / "events.jsonl"
    launch = Launch()
    try:
        r = launch.run(
            "--nproc_per_node", "3", "--recovery", "in-place", "--in_place_timeout", "10", "--no-live",
            "--events_file", str(ev), *flags, WORKER, timeout=100, env={"WAIT": "15", **env},
        )  # fmt: skip
    finally:
        launch.cleanup()
    return r, ev


@pytest.mark.timeout(120)
def test_a_rank_lost_after_every_rank_finished_runs_nothing_again(tmp_path):
    r, ev = run(tmp_path, "--max_restarts", "1", env={"AFTER_END": "2"})
    assert r.returncode == 0, r.stderr
    assert "rank 2 killed by SIGKILL after every rank finished the job; nothing runs again" in r.stderr, r.stderr
    assert [e["rank"] for e in events(ev, "lost_after_end")] == [2]
    assert len(events(ev, "spawn")) == 3 and len(events(ev, "running")) == 1  # nothing started again
    assert "recovering in place" not in r.stderr and "root cause" not in r.stderr, r.stderr
    assert r.stdout.count("done rank=") == 2, r.stdout


@pytest.mark.timeout(150)
def test_a_rank_lost_after_the_end_on_another_node_runs_nothing_again(tmp_path):
    """Across nodes each agent judges its own ranks: the node of the rank lost after the end (it does not
    serve the workers' store) asks for no round; both end 0. Rank 3 dies once group rank 0's node has
    exited with the store (as on a loaded host): the word its workers left in its node's memory folder
    says the job ended."""
    cluster = Cluster()
    try:
        port = free_port()
        cluster.store("127.0.0.1", port)
        flags = c10d(port, "2", nproc=2, run_id="after", conf="is_host=false")
        agents = [
            cluster.start(*flags, "--recovery", "in-place", "--max_restarts", "1", "--no-live",
                          "--events_file", str(tmp_path / f"{n}.events"), WORKER, name=n, env={"AFTER_END": "3 gone"})
            for n in ("a", "b")
        ]  # fmt: skip
        codes = [a.wait(120) for a in agents]
    finally:
        cluster.cleanup()
    assert codes == [0, 0], "\n".join(a.stderr[-3000:] for a in agents)
    said = [a for a in agents if "rank 3 killed by SIGKILL after every rank finished the job" in a.stderr]
    assert len(said) == 1, "\n".join(a.stderr[-3000:] for a in agents)
    for n in ("a", "b"):
        assert len(events(tmp_path / f"{n}.events", "running")) == 1  # no round more, anywhere


@pytest.mark.timeout(120)
def test_a_second_rank_lost_before_entering_the_pending_round_is_seated_there_free(tmp_path):
    """Rank 2 killed; rank 1 lost ms later, at the agent's word, before it entered round 1: both are replaced
    in round 1, one restart charged (with --max_restarts 1 the job lives, as with --recovery restart)."""
    r, ev = run(tmp_path, "--max_restarts", "1", env={"VICTIM": "2", "SECOND": "1 kill"})
    assert r.returncode == 0, r.stderr
    assert [(e["rank"], e["round"]) for e in events(ev, "spawn")[3:]] == [(2, 1), (1, 1)]
    assert [(e["round"], e["restarts"]) for e in events(ev, "running")] == [(0, 0), (1, 1)]
    assert [e["ranks"] for e in events(ev, "recovered")] == [[1, 2]]
    assert not events(ev, "in_place_declined") and not events(ev, "stopping")
    line = "rank 1 killed by SIGKILL before entering round 1, which is recovering in place: starting rank 1 in that"
    assert line in r.stderr, r.stderr
    assert sorted(re.findall(r"done rank=(\d) round=1", r.stdout)) == ["0", "1", "2"], r.stdout


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_go_on_in_place_restarts_the_group_free_of_charge(tmp_path):
    """Rank 2 killed; rank 1, a survivor, exits LEAVE_EXIT at the agent's word: the group restarts, charging
    nothing more than the fault (with --max_restarts 1 the job lives)."""
    r, ev = run(tmp_path, "--max_restarts", "1", env={"VICTIM": "2", "SECOND": "1 leave"})
    assert r.returncode == 0, r.stderr
    assert [(e["round"], e["restarts"]) for e in events(ev, "running")] == [(0, 0), (1, 1), (2, 1)]
    assert [e["reason"] for e in events(ev, "in_place_declined")] == [
        "rank 1 cannot go on in place (exit 86) while round 1 recovers in place"
    ]
    lines = [line for line in r.stderr.splitlines() if "rank 1" in line and "86" in line]
    assert len(lines) == 1 and "restarting the group, charging no more restarts" in lines[0], r.stderr
    assert sorted(re.findall(r"done rank=(\d) round=2", r.stdout)) == ["0", "1", "2"], r.stdout
