"""The worker-side workloads: `bench allreduce` (nccl-tests' table and formulas, its check) and
`check` (the pre-flight table, its verdict, a corrupt rank and a slow rank named)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from support import needs
from support.paths import ROOT
from support.processes import wait_gone

pytestmark = needs.torch

# "[rank0]:   size count type | time algbw busbw #wrong | time algbw busbw #wrong"
ROW = re.compile(r"^\[rank0\]: +(\d+) +(\d+) +(\w+)" + r" +([0-9.]+) +([0-9.]+) +([0-9.]+) +(\d+)" * 2 + "$", re.M)
SMALL = ["-b", "1K", "-e", "64K", "-f", "8", "-w", "1", "-n", "3"]  # 1K, 8K, 64K


def test_import_cli_stays_light():
    code = (
        "import sys, launcher.cli.commands; "
        "print(sorted(m for m in ('torch', 'launcher.worker.allreduce', 'launcher.worker.preflight') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_bench_allreduce_two_workers(launch):
    r = launch.run("bench", "allreduce", "--nproc_per_node", "2", "--", *SMALL, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "goodput" not in r.stderr, r.stderr
    head = [l for l in r.stdout.splitlines() if l.startswith("[rank0]: #")]
    assert "2 ranks, backend gloo, device cpu, float32" in head[0]
    assert "out-of-place" in head[1] and "in-place" in head[1]
    assert head[2].split()[2:] == ["size", "count", "type"] + ["time", "algbw", "busbw", "#wrong"] * 2
    assert head[3].split()[2:] == ["(B)", "(elements)"] + ["(us)", "(GB/s)", "(GB/s)"] * 2
    rows = ROW.findall(r.stdout)
    assert [(int(s), int(c), t) for s, c, t, *_ in rows] == [
        (1024, 256, "float32"),
        (8192, 2048, "float32"),
        (65536, 16384, "float32"),
    ]
    for row in rows:
        for time_us, algbw, busbw, wrong in (row[3:7], row[7:11]):
            assert busbw == algbw  # 2(n-1)/n = 1 for n = 2
            assert float(algbw) == pytest.approx(int(row[0]) / 1e9 / (float(time_us) * 1e-6), rel=0.02, abs=1e-3)
            assert wrong == "0"
    assert "[rank0]: # Out of bounds values : 0 OK" in r.stdout
    assert re.search(r"^\[rank0\]: # Avg bus bandwidth    : [0-9.]+ GB/s$", r.stdout, re.M)
    assert "[rank1]:" not in r.stdout  # rank 0 alone prints
    assert not wait_gone(launch.token)


def test_bench_example_three_workers_formula_and_failed_check(launch, tmp_path):
    """examples/allreduce_bench.py, 3 ranks, bfloat16, rank 1's check input off by one (the hook):
    busbw = algbw * 2(n-1)/n = 4/3 algbw in the JSON rows (unrounded), every rank sees the wrong
    sum in both placements, and the job fails."""
    out = tmp_path / "rows.json"
    r = launch.run(
        "--nproc_per_node",
        "3",
        str(ROOT / "examples" / "allreduce_bench.py"),
        *SMALL,
        "-d",
        "bfloat16",
        "-J",
        str(out),
        env={"LAUNCHER_ALLREDUCE_CORRUPT_RANK": "1"},
        timeout=90,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["world"] == 3 and len(data["rows"]) == 3
    for row in data["rows"]:
        assert row["type"] == "bfloat16" and row["count"] == row["size"] // 2
        for place in ("oop", "ip"):
            cell = row[place]
            assert cell["algbw"] == pytest.approx(row["size"] / 1e9 / (cell["time_us"] * 1e-6))
            assert cell["busbw"] == pytest.approx(cell["algbw"] * 2 * (3 - 1) / 3)
            assert cell["wrong"] == 3  # the last element, on each of the 3 ranks
    bus = [row[p]["busbw"] for row in data["rows"] for p in ("oop", "ip")]
    assert data["avg_busbw"] == pytest.approx(sum(bus) / len(bus))
    assert [row[6] for row in ROW.findall(r.stdout)] == ["3", "3", "3"]
    assert "[rank0]: # Out of bounds values : 18 FAILED" in r.stdout  # 3 sizes x 2 placements x 3 ranks


def table(stdout: str) -> dict[int, list[str]]:
    """The check's rows by rank: rank host local device backend torch python cuda nccl gpu ar ag GB/s status."""
    rows = re.findall(r"^\[rank0\]: (\d+  .*)$", stdout, re.M)
    return {int(row.split()[0]): row.split() for row in rows}


@pytest.mark.parametrize("nproc", [2, 3])
def test_check_passes(launch, nproc):
    # 3 ranks share 2 busy cores here: a sound rank's pair bandwidth swings 2x, so judge only what is
    # far off (test_check_names_a_slow_rank covers the default judging)
    r = launch.run("check", "--nproc_per_node", str(nproc), "--", "--slow-factor", "0.2", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(
        r"^\[rank0\]: rank +host +local +device +backend +torch +python +cuda +nccl +gpu +all_reduce"
        r" +all_gather +pair GB/s +status$",
        r.stdout,
        re.M,
    )
    rows = table(r.stdout)
    assert sorted(rows) == list(range(nproc))
    for rank, row in rows.items():
        assert row[2:5] == [str(rank), "cpu", "gloo"] and row[10:12] == ["ok", "ok"] and row[-1] == "ok", row
        assert float(row[12]) > 0
    assert f"[rank0]: all_reduce over {nproc} ranks, busbw (median of ranks): 256K " in r.stdout
    assert f"[rank0]: PASS: {nproc} ranks on 1 host(s)" in r.stdout
    assert ("cannot tell which is slow" in r.stdout) == (nproc == 2)
    assert "goodput" not in r.stderr, r.stderr  # a check trains nothing: no goodput line (issue 34)
    # no step of it is silent: rank 0 says each as it starts (importing torch alone takes seconds)
    said = re.findall(r"^\[rank0\]: check: (.*)$", r.stderr, re.M)
    assert said[0] == f"{nproc} ranks: importing torch, then joining the process group", r.stderr
    assert said[1].startswith("joined (gloo on cpu); all_reduce and all_gather"), r.stderr
    assert said[2] == f"bandwidth: all_reduce over {nproc} ranks at 256K, 4M (best of 5 each)", r.stderr
    pairs = [f"pair probe {k} of {nproc}: the ranks in pairs, all_reduce at 256K, 4M" for k in range(1, nproc + 1)]
    assert said[3:] == pairs, r.stderr
    assert not wait_gone(launch.token)


def test_check_names_a_corrupt_rank(launch):
    # judged on its data alone: a busy host's bandwidth swings would flag a sound rank slow too (as above)
    r = launch.run(
        "check", "--nproc_per_node", "3", "--", "--slow-factor", "0.2",
        env={"LAUNCHER_PREFLIGHT_CORRUPT_RANK": "1"}, timeout=90,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    rows = table(r.stdout)
    assert rows[1][10:13] == ["WRONG", "(sent)", "ok"] and rows[1][-1] == "FAIL"
    assert rows[0][-1] == rows[2][-1] == "ok"  # the others received its bad row: not their fault
    assert "[rank0]: FAIL: 1 of 3 ranks have problems:" in r.stdout
    assert re.search(r"^\[rank0\]:   rank 1 \(.*\): all_reduce: its data arrived wrong on 3/3 ranks$", r.stdout, re.M)
    assert "root cause: rank 1 " in r.stderr  # the rank to blame exits first
    assert not wait_gone(launch.token)


def test_check_names_a_slow_rank(launch):
    """Rank 2 sleeps in every probe all_reduce: its pairs (with 0, with 1) are both slow, while
    0 and 1 also have their pair together, so only rank 2's best pair is under half the median."""
    r = launch.run(
        "check", "--nproc_per_node", "3", "--", "--sizes", "1M", env={"LAUNCHER_PREFLIGHT_SLOW_RANK": "2"}, timeout=90
    )
    assert r.returncode == 1, r.stdout + r.stderr
    rows = table(r.stdout)
    assert [rows[k][-1] for k in range(3)] == ["ok", "ok", "FAIL"], r.stdout
    assert re.search(r"^\[rank0\]:   rank 2 \(.*\): slow: [0-9.]+ GB/s, under 0.5x the median", r.stdout, re.M)


def row_sizes(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if re.match(r"\[rank0\]:\s+\d", line)]


@pytest.mark.timeout(120)
def test_bench_allreduce_with_only_b_and_e_doubles_the_size(launch):
    r = launch.run(
        "bench", "allreduce", "--nproc_per_node", "2", "--", "-b", "1K", "-e", "8K", "-w", "0", "-n", "1", timeout=100
    )
    assert r.returncode == 0, r.stderr
    assert row_sizes(r.stdout) == [1024, 2048, 4096, 8192], r.stdout
