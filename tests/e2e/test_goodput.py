"""Goodput of a scripted job against the truth, the metrics endpoint during a job and after its
restart, and `launcher report` drawn by a real headless browser.

The job (tests/workers/goodput_steps.py): 30 steps on a fixed schedule of STEP_TIME s, a checkpoint
every 10 steps, rank 1 exits 7 on attempt 0 when it is about to do step 16 (it reached 15). The
truth: 1 restart; 5 steps re-done (15 - 10; 6 when the other rank finishes step 16 before it is
stopped); training + re-done = (15 - 1) + (30 - 11) steps of STEP_TIME (from each round's first step
to its last). Re-done steps within one step (another rank may be a step ahead or behind when it
stops). Tolerance: TOLERANCE s on each time (the launcher reads the progress files every
0.1 s, and this machine is shared), and the components sum to the wall time within 10 ms.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import time
import urllib.request
import zlib
from pathlib import Path

import pytest
from support import system
from support.launcher_runs import c10d
from support.paths import LAUNCHER, worker
from support.ports import free_port

STEP_TIME = 0.2
TOLERANCE = 0.6
JOB = {"STEPS": "30", "STEP_TIME": str(STEP_TIME), "CKPT_EVERY": "10", "FAIL_RANK": "1", "FAIL_AT": "16"}
COMPONENTS = ("training", "startup", "rendezvous", "restart", "redone", "stall", "shutdown")
LINE = re.compile(r"launcher: goodput (\d+\.\d) % of [^:]+: (.*)")


def goodput_event(path: Path) -> dict:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return next(e for e in events if e["event"] == "goodput")


def check_truth(b: dict) -> None:
    assert b["restarts"] == 1, b
    # 15 - 10, give or take the step another rank was doing when it stopped: a node that heard of
    # the failure from the store had started its workers a little before or after the failing one
    assert b["redone_steps"] in (4, 5, 6), b
    assert b["redone"] == pytest.approx(b["redone_steps"] * STEP_TIME, abs=TOLERANCE), b
    assert b["training"] + b["redone"] == pytest.approx((14 + 19) * STEP_TIME, abs=TOLERANCE), b
    assert b["stall"] == 0.0 and b["steps_known"], b
    assert 0 < b["restart"] < 5 and 0 < b["startup"] < 5, b
    assert sum(b[c] for c in COMPONENTS) == pytest.approx(b["wall"], abs=0.01), b
    assert b["goodput"] == pytest.approx(b["training"] / b["wall"], abs=1e-4)


def test_goodput_of_one_node_is_the_truth(cluster, tmp_path):
    events = tmp_path / "events.jsonl"
    agent = cluster.start(
        "--nproc_per_node", "2", "--max_restarts", "1", "--events_file", str(events), worker("goodput_steps.py"),
        env={**JOB, "CKPT_DIR": str(tmp_path)},
    )  # fmt: skip
    assert agent.wait(90) == 0, agent.stderr
    event = goodput_event(events)
    check_truth(event["node"])
    assert event["job"] == event["node"]
    line = agent.wait_for(LINE.pattern, stream="err")
    assert float(line.group(1)) == pytest.approx(100 * event["node"]["goodput"], abs=0.051)
    assert "restarts" in line.group(2) and "re-done steps" in line.group(2)
    assert agent.err[-1].endswith(line.group(0)), "the goodput line is the node's last"


@pytest.fixture
def two_nodes(cluster, tmp_path):
    """The job on two c10d nodes (one worker each), their events files in tmp_path/events/."""
    port = free_port()
    agents = [
        cluster.start(
            *c10d(port, "2", "--max_restarts", "1", "--events_file", str(tmp_path / "events" / f"node{n}.jsonl")),
            worker("goodput_steps.py"),
            env={**JOB, "CKPT_DIR": str(tmp_path)},
        )
        for n in range(2)
    ]
    status, deadline = None, time.monotonic() + 30
    while status is None and time.monotonic() < deadline:  # the job's goodput so far, while it runs
        out = subprocess.run(
            [*LAUNCHER, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "job",
             "--json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        job = json.loads(out.stdout) if out.returncode == 0 else {}
        if job.get("goodput") and len([n for n in job["nodes"] if n.get("goodput")]) == 2:
            status = job
        time.sleep(0.2)  # the pace of the polling; the condition above decides
    for a in agents:
        assert a.wait(90) == 0, a.stderr
    return agents, tmp_path / "events", status


def test_goodput_of_two_c10d_nodes_is_the_same_on_both(two_nodes):
    agents, folder, status = two_nodes
    assert status is not None, "launcher status --json never showed both nodes' goodput"
    assert status["goodput"]["nodes"] == 2 and 0 < status["goodput"]["wall"] and not status["goodput"]["final"]
    events = [goodput_event(folder / f"node{n}.jsonl") for n in range(2)]
    assert events[0]["job"] == events[1]["job"] and events[0]["job"]["nodes"] == 2
    for e in events:
        check_truth(e["node"])
    check_truth(events[0]["job"])
    lines = [a.wait_for(LINE.pattern, stream="err").group(0) for a in agents]
    job_part = [re.sub(r"; this node [\d.]+ %\)$", "", line) for line in lines]
    assert job_part[0] == job_part[1] and "(job-wide, 2 nodes" in lines[0]


CHROMIUM = system.which("chromium") or system.which("chromium-browser") or system.which("google-chrome")


@pytest.mark.skipif(not CHROMIUM, reason=system.missing("chromium", "chromium"))
def test_the_report_of_a_two_node_job_draws_in_chromium(two_nodes, tmp_path):
    _, folder, _ = two_nodes
    page, png = tmp_path / "report.html", tmp_path / "report.png"
    cli = subprocess.run(
        [*LAUNCHER, "report", str(folder), "-o", str(page)], capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0, cli.stderr
    text = page.read_text()
    assert "succeeded after 1 restart(s)" in text and "exited with code 7" in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "the page loads nothing from a network"
    shot = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,700",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert png.exists(), shot.stderr[-2000:]
    width, height, pixel = read_png(png.read_bytes())
    # The timeline lanes (node 0 and node 1) are drawn from y=130 to y=200, x=260 to x=1000 on this
    # page: most of that box is the green of running workers, and the failure marker is red.
    box = [pixel(x, y) for y in range(130, 200, 3) for x in range(260, 1000, 5)]
    green = sum(1 for p in box if near(p, (0x2E, 0x9D, 0x58)))
    assert green > len(box) * 0.3, f"{green} of {len(box)} pixels of the timeline are green"
    assert any(near(p, (0xC0, 0x39, 0x2B)) for p in (pixel(x, y) for y in range(125, 200) for x in range(260, 1000)))


def near(p: tuple[int, int, int], q: tuple[int, int, int], by: int = 24) -> bool:
    return all(abs(a - b) <= by for a, b in zip(p, q))


def read_png(data: bytes):
    """(width, height, pixel(x, y) -> (r, g, b)) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and not interlace, header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, lambda x, y: tuple(rows[y][x * bpp : x * bpp + 3])


def test_metrics_while_the_job_runs_and_after_its_restart(cluster, tmp_path):
    agent = cluster.start(
        "--nproc_per_node", "2", "--max_restarts", "1", "--metrics_port", "0", worker("goodput_steps.py"),
        env={**JOB, "STEPS": "60", "FAIL_AT": "8", "STEP_TIME": "0.1", "CKPT_DIR": str(tmp_path)},
    )  # fmt: skip
    port = agent.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", stream="err").group(1)

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        return {k: float(v) for k, v in re.findall(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)}

    def scrape_until(done, bound: float = 60) -> dict[str, float]:
        deadline, seen = time.monotonic() + bound, {}
        while time.monotonic() < deadline:
            seen = scrape()
            if done(seen):
                break
            time.sleep(0.2)  # the pace of the polling, not a synchronisation: `done` decides
        return seen

    # the server answers from start-up on; the node is a member once the rendezvous is done
    first = scrape_until(lambda m: m.get('launcher_nodes{state="member"}') == 1)
    assert first["launcher_restarts_budget"] == 1 and first['launcher_nodes{state="member"}'] == 1, first
    assert 'launcher_goodput_seconds{component="training"}' in first
    agent.wait_for(r"round 1 \(restart", stream="err")
    # until the restarted workers' steps are on the board (every 2 s)
    after = scrape_until(lambda m: m["launcher_restarts"] == 1 and m.get('launcher_worker_step{rank="1"}', 0) > 8)
    assert after["launcher_restarts"] == 1, after
    assert after['launcher_failures_total{cause="exit"}'] == 1, after
    # the restarted workers run, or (on a slow machine, by this scrape) have just finished their steps
    done = after.get('launcher_workers{state="succeeded"}', 0)
    assert (
        after['launcher_group_state{state="running"}'] == 1 and after['launcher_workers{state="running"}'] + done == 2
    )
    assert after['launcher_worker_step{rank="1"}'] > 8, after
    assert after['launcher_goodput_seconds{component="restart"}'] > 0, after
    assert agent.wait(90) == 0, agent.stderr
