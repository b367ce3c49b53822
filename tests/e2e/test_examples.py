"""The examples: the DDP demo trains, and after losing a worker it resumes to the very same
weights; every collective and point-to-point op gives the right result on every rank."""

from __future__ import annotations

import re

import pytest
from support.launcher_runs import Launch, said_seconds
from support.paths import ROOT
from support.processes import wait_gone

TRAIN = str(ROOT / "examples" / "train_ddp.py")
COLLECTIVES = str(ROOT / "examples" / "collectives.py")
EPOCHS = 4
OPS = [
    "send/recv",
    "broadcast",
    "scatter",
    "gather",
    "reduce",
    "all_gather",
    "all_reduce sum",
    "all_reduce max",
    "barrier",
]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One uninterrupted 2-worker run with the default checkpoint dir (./runs/ckpt under its cwd),
    shared by the tests below: (CompletedProcess, its working directory)."""
    cwd = tmp_path_factory.mktemp("baseline")
    launch = Launch()
    try:
        r = launch.run(
            "--nproc_per_node", "2", TRAIN, "--epochs", str(EPOCHS), "--out", "final.pt", cwd=str(cwd), timeout=90
        )
        assert not wait_gone(launch.token), "processes left behind"
    finally:
        launch.cleanup()
    return r, cwd


def test_train_ddp_two_workers(baseline):
    r, cwd = baseline
    assert r.returncode == 0, r.stdout + r.stderr
    ckpt = cwd / "runs" / "ckpt" / "last.pt"
    assert "[rank0]: attempt 0 (TORCHELASTIC_RESTART_COUNT=0): 2 workers, backend gloo" in r.stdout
    assert f"checkpoints go to {ckpt}" in r.stdout  # the default, under the current dir, printed
    for epoch in range(1, EPOCHS + 1):
        assert f"[rank0]: epoch {epoch}/{EPOCHS}  loss " in r.stdout
    assert "[rank1]: epoch" not in r.stdout  # progress comes from rank 0 only
    assert ckpt.is_file() and (cwd / "final.pt").is_file()
    assert not list(ckpt.parent.glob("*.tmp*"))  # atomic writes leave no temp file behind


def test_resume_after_lost_worker_gives_identical_weights(baseline, launch, tmp_path):
    torch = pytest.importorskip("torch")
    a, a_cwd = baseline
    assert a.returncode == 0, a.stdout + a.stderr
    out = tmp_path / "final.pt"
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "1",
        TRAIN,
        "--epochs",
        str(EPOCHS),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--out",
        str(out),
        "--crash-at-epoch",
        "3",
        "--crash-rank",
        "1",
        timeout=90,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank1]: rank 1: test hook, killing myself halfway through epoch 3" in r.stdout
    assert "TORCHELASTIC_RESTART_COUNT=1" in r.stdout  # the launcher restarted the group...
    assert f"loaded {tmp_path / 'ckpt' / 'last.pt'} after epoch 2" in r.stdout  # ...which loaded its file, then
    assert re.search(r"resumed at step \d+ \(epoch 3\) from the launcher's copy in memory", r.stdout)  # the step
    assert r.stdout.count(f"[rank0]: epoch {EPOCHS}/{EPOCHS}") == 1
    assert not wait_gone(launch.token)
    # the restart the goodput line books is what the script saw (its Job reports the steps: nothing asked of it)
    said = float(re.search(r"training again (\d+\.\d) s after rank 1 was killed", r.stdout)[1])
    booked = said_seconds(re.search(r"goodput .* restarts (\d[^,;(]*) \(1\)", r.stderr)[1])
    assert abs(booked - said) <= max(0.5, 0.05 * said), (booked, said, r.stderr[-1500:])
    assert "estimated" not in r.stderr, r.stderr[-1500:]
    # rank 0's error about the lost peer (most runs have one): one line, after the root cause
    if "Connection reset by peer" in r.stdout + r.stderr:
        assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
        collateral = (
            r"killed by SIGKILL; stopping the group\n(.*\n)*\[rank0\]: RuntimeError: .*Connection reset by peer.*"
            r"  \(after rank 1 killed by SIGKILL; the whole traceback is in \S+traceback\.log\)"
        )
        assert re.search(collateral, r.stderr), r.stderr[-3000:]

    want = torch.load(a_cwd / "final.pt")
    got = torch.load(out)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


# spawned: the one in-place exactness test whose replacement imports torch itself (test_in_place_exact forks)
@pytest.mark.parametrize("workers_from", ["spawn"], indirect=True)
def test_in_place_the_lost_worker_alone_resumes_at_its_batch_to_identical_weights(baseline, launch, tmp_path):
    """The same script with --recovery in-place: rank 1 killed halfway through epoch 3 comes back alone,
    the survivor keeps its process, nobody reads a checkpoint, and the final weights are the same."""
    torch = pytest.importorskip("torch")
    a, a_cwd = baseline
    out = tmp_path / "final.pt"
    args = ["--epochs", str(EPOCHS), "--checkpoint-dir", str(tmp_path / "ckpt"), "--out", str(out)]
    r = launch.run(
        "--nproc_per_node", "2", "--recovery", "in-place", "--max_restarts", "1", TRAIN, *args,
        "--crash-at-epoch", "3", "--crash-rank", "1", timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recovering in place: round 1 (1 of 1 restarts used), starting rank 1" in r.stderr, r.stderr
    assert "resumed from" not in r.stdout and "TORCHELASTIC_RESTART_COUNT=1" not in r.stdout  # rank 0 kept going
    assert r.stdout.count(f"[rank0]: epoch {EPOCHS}/{EPOCHS}") == 1
    want, got = torch.load(a_cwd / "final.pt"), torch.load(out)
    assert all(torch.equal(want[name], got[name]) for name in want), "the weights differ"


@pytest.mark.parametrize("workers_from", ["preload"], indirect=True)  # three torch workers: one import
@pytest.mark.parametrize("nproc", [3])  # an odd world: no op can pass by pairing ranks
def test_collectives(launch, nproc):
    r = launch.run("--nproc_per_node", str(nproc), COLLECTIVES, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    for op in OPS:  # one table row per op, from rank 0: "op  yes  1.23 ms"
        assert re.search(rf"^\[rank0\]: {re.escape(op)}[ ,].* yes +[0-9.]+ ms$", r.stdout, re.M), op
    assert f"[rank0]: all {len(OPS)} checks passed on {nproc} ranks (gloo, cpu)" in r.stdout
    assert not wait_gone(launch.token)
