"""`launcher status` against real jobs: running (JSON), failed (on a standalone store, which outlives
the nodes), never formed; a wrong join token is one line and exit 2. Read-only: it never joins."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from support.launcher_runs import c10d
from support.paths import LAUNCHER, ROOT, worker
from support.ports import free_port
from support.processes import wait_for

STEPPER = worker("stepper.py")


def status(port: int, *extra: str, run_id: str = "job", env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [
            *LAUNCHER,
            "status",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
            "--rdzv_id",
            run_id,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=full,
    )


def job(port: int, **kw) -> dict:
    r = status(port, "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.timeout(90)
def test_status_of_a_running_job_shows_every_node_and_rank_with_step_rates(cluster):
    port = free_port()
    for _ in range(2):
        cluster.start(*c10d(port, "2", "--max_restarts", "3", nproc=2), STEPPER, env={"STEP_TIME": "0.05"})
    seen: dict = {}

    def rates_known() -> bool:
        seen.update(job(port))
        return (
            seen.get("state") == "running"
            and len(seen["nodes"]) == 2
            and all(w["rate"] for n in seen["nodes"] for w in n["workers"])
        )

    wait_for(rates_known, timeout=40, what="both nodes' snapshots with step rates")
    assert (seen["round"], seen["restarts"], seen["max_restarts"]) == (0, 0, 3)
    assert sorted(w["rank"] for n in seen["nodes"] for w in n["workers"]) == [0, 1, 2, 3]
    for n in seen["nodes"]:
        assert n["state"] == "running" and n["heartbeat_age"] < 10
        for w in n["workers"]:
            assert (
                w["state"] == "running"
                and w["pid"] > 0
                and w["step"] > 0
                and 2 < w["rate"] < 40
                and w["progress_age"] < 5
            )
    table = status(port)
    assert table.returncode == 0 and "running" in table.stdout and "rank 3" in table.stdout, table.stdout


@pytest.mark.timeout(90)
def test_status_of_a_failed_job_names_the_root_cause(cluster):
    port = free_port()
    cluster.store("127.0.0.1", port)
    agents = [
        cluster.start(
            *c10d(port, "2", nproc=2, conf="is_host=false"),
            worker("raise_rank.py"),
            env={"FAIL_RANK": "2", "SLEEP": "60"},
        )
        for _ in range(2)
    ]
    assert [a.wait(60) for a in agents] == [1, 1]
    seen = job(port)
    assert seen["state"] == "closed" and "restart budget spent" in seen["closed"]
    assert seen["verdict"]["rank"] == 2 and seen["verdict"]["error"] == "RuntimeError: loss is NaN at step 7 on rank 2"
    assert {n["state"] for n in seen["nodes"]} == {"failed"}  # each node's last word
    # the restarts done, as the agents' verdict says them: the failure that spent the budget restarted nothing
    assert all("job failed (exit code 1) after 0 restart(s)" in a.stderr for a in agents), agents[0].stderr
    assert (seen["restarts"], seen["max_restarts"], seen["failures"]) == (0, 0, 1)
    table = status(port)
    assert "root cause: rank 2" in table.stdout, table.stdout
    assert "restarts 0 of 0" in table.stdout, table.stdout


@pytest.mark.timeout(60)
def test_status_of_a_job_that_never_formed_and_of_no_job(cluster):
    port = free_port()
    alone = cluster.start(*c10d(port, "2", conf="join_timeout=60"), STEPPER)
    wait_for(lambda: job(port).get("forming", {}).get("joined") == 1, timeout=30, what="one node joined")
    seen = job(port)
    assert seen["state"] == "forming" and seen["nodes"] == [] and seen["round"] == 0
    assert job(port, run_id="other")["state"] == "absent"
    assert alone.popen.poll() is None


@pytest.mark.timeout(60)
def test_status_with_a_wrong_or_missing_token_is_one_line_and_exit_2(cluster):
    port = free_port()
    cluster.start(*c10d(port, "2", conf="join_timeout=60"), STEPPER, env={"LAUNCHER_JOIN_TOKEN": "right"})
    wait_for(
        lambda: status(port, env={"LAUNCHER_JOIN_TOKEN": "right"}).returncode == 0,
        timeout=30,
        what="the job in the store",
    )
    for env, says in (({"LAUNCHER_JOIN_TOKEN": "wrong"}, "wrong join token for"), ({}, "needs a join token: set")):
        r = status(port, "--json", env=env)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("launcher status: error: "), r.stderr
        assert says in r.stderr, r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra, rc, message",
    [
        (("--rdzv_backend", "static"), 2, "launcher status reads a c10d or etcd rendezvous, not 'static'"),
        (("--watch", "0.1"), 2, "--watch '0.1' must be at least 0.5"),
        ((), 1, "cannot reach the rendezvous store at 127.0.0.1:"),
    ],
)
def test_status_bad_flags_or_no_store_are_one_line(extra, rc, message):
    r = status(free_port(), *extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == rc and message in lines[-1], r.stderr
    # a store that does not answer is retried for 5 s: said at once, never waited on silently
    assert len(lines) == (2 if rc == 1 else 1), r.stderr
    if rc == 1:
        assert re.fullmatch(r"launcher: cannot reach the store at 127\.0\.0\.1:\d+ yet \(.*\); retrying .*", lines[0])


# ---------------------------------------------------------------------------- stragglers


def straggler_job(cluster, tmp_path, env: dict) -> tuple[int, list]:
    port = free_port()
    flags = ("--straggler_threshold", "0.5", "--straggler_period", "4")
    agents = [
        cluster.start(
            *c10d(port, "2", *flags, "--events_file", str(tmp_path / f"events{i}.jsonl"), nproc=2), STEPPER, env=env
        )
        for i in range(2)
    ]
    return port, agents


@pytest.mark.timeout(90)
def test_a_rank_slowed_on_purpose_is_flagged_in_bounded_time(cluster, tmp_path):
    port, agents = straggler_job(cluster, tmp_path, {"STEP_TIME": "0.05", "SLOW_RANK": "3", "SLOW_TIME": "0.4"})
    t0 = time.monotonic()
    wait_for(
        lambda: any("rank 3 on" in e and "is a straggler" in e for a in agents for e in a.err),
        timeout=40,
        what="the straggler line",
    )
    assert time.monotonic() - t0 < 40  # 4 s below half the median, once rates are known (2 s snapshots, 10 s window)
    said = [e for a in agents for e in a.err if "is a straggler" in e]
    assert len(said) == 1 and "(--straggler_threshold)" in said[0] and "below 0.5 of the job's median" in said[0], said
    events = [json.loads(l) for p in tmp_path.glob("events*.jsonl") for l in p.read_text().splitlines()]
    assert [e["rank"] for e in events if e["event"] == "straggler"] == [3]
    wait_for(lambda: job(port)["stragglers"] == [3], timeout=10, what="status naming the straggler")
    assert "rank 3" in status(port).stdout and "straggler" in status(port).stdout


@pytest.mark.timeout(90)
def test_a_uniformly_slow_job_has_no_straggler(cluster, tmp_path):
    port, agents = straggler_job(cluster, tmp_path, {"STEP_TIME": "0.4"})
    wait_for(
        lambda: len(job(port)["nodes"]) == 2 and all(w["rate"] for n in job(port)["nodes"] for w in n["workers"]),
        timeout=40,
        what="every rank's step rate",
    )

    def steps() -> dict[int, int]:
        return {w["rank"]: w["step"] or 0 for n in job(port)["nodes"] for w in n["workers"]}

    # a rank is flagged after 4 s below half the median: every rank steps on for twice that with its
    # rate known (20 steps of 0.4 s), as its own published progress shows
    first = steps()
    wait_for(lambda: all(s >= first[r] + 20 for r, s in steps().items()), timeout=40, what="20 more steps of each rank")
    seen = job(port)
    assert seen["stragglers"] == [] and not any("straggler" in e for a in agents for e in a.err)
    assert all(0.5 < w["rate"] < 3.5 for n in seen["nodes"] for w in n["workers"]), seen


@pytest.mark.timeout(90)
def test_a_slow_rank_of_a_single_node_job_is_flagged_too(cluster):
    alone = cluster.start(
        "--nproc_per_node",
        "3",
        "--straggler_threshold",
        "0.5",
        "--straggler_period",
        "3",
        STEPPER,
        env={"STEP_TIME": "0.05", "SLOW_RANK": "1", "SLOW_TIME": "0.4"},
    )
    alone.wait_for(
        r"launcher: rank 1 on \S+ is a straggler: [\d.]+ steps/s, below 0.5 of the job's median [\d.]+ for 3 s",
        stream="err",
        timeout=40,
    )
    assert sum("is a straggler" in e for e in alone.err) == 1


@pytest.mark.timeout(60)
def test_status_watch_refreshes_until_interrupted(cluster):
    import os
    import signal as sig

    port = free_port()
    cluster.start(*c10d(port, "2", conf="join_timeout=60"), STEPPER)
    wait_for(lambda: job(port).get("forming", {}).get("joined") == 1, timeout=30, what="one node joined")
    watch = subprocess.Popen(
        [*LAUNCHER, "status", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "job", "--json", "--watch", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    first = [watch.stdout.readline() for _ in range(3)]  # three refreshes, then Ctrl-C
    watch.send_signal(sig.SIGINT)
    out, err = watch.communicate(timeout=10)
    reads = [json.loads(line) for line in "".join(first).splitlines() + out.splitlines()]
    assert watch.returncode == 0 and len(reads) >= 3 and {r["state"] for r in reads} == {"forming"}, (out, err)
