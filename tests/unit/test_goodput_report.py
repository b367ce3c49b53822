"""`launcher report`'s page from scripted events files (in-process), and the metrics flags' parsing."""

import json

import pytest

from launcher import config as cfg
from launcher.cli.report import find_files, read_node, render, report_main, verdict
from launcher.errors import ConfigError
from launcher.telemetry.goodput import Breakdown

T = 1_800_000_000.0
JOB = Breakdown(wall=10.0, training=7.0, restart=2.0, rendezvous=1.0, restarts=1, steps_known=True, nodes=2)


def events(node: int, failing: bool) -> list[dict]:
    out = [
        {"event": "rendezvous", "cause": "start"},
        {"event": "running", "round": 0, "restarts": 0, "group_rank": node, "group_world_size": 2},
        {"event": "exit", "rank": node, "returncode": 7 if failing else -15, "how": "exited with code 7",
         "collateral": not failing},
        {"event": "stopping", "reason": "restart"},
        {"event": "rendezvous", "cause": "failure"},
        {"event": "spare_took_over", "group_rank": 1},
        {"event": "running", "round": 1, "restarts": 1, "group_rank": node, "group_world_size": 2},
        {"event": "straggler", "rank": node, "rate": 1.0, "median": 3.0},
        {"event": "goodput", "host": f"h{node}", "node": JOB.to_dict(), "job": JOB.to_dict(), "why": ""},
        {"event": "finished", "state": "succeeded", "exit_code": 0, "restarts": 1},
    ]  # fmt: skip
    return [{"time": T + i + node * 0.1, **e} for i, e in enumerate(out)]


def write(path, rows, torn: bool = False) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + ('{"time": 1, "eve' if torn else ""))


def test_the_page_has_a_lane_per_node_the_marks_the_goodput_and_the_verdict(tmp_path):
    write(tmp_path / "node0.jsonl", events(0, False))
    write(tmp_path / "node1.jsonl", events(1, True), torn=True)
    (tmp_path / "notes.txt").write_text("not events")
    files = find_files([str(tmp_path)])
    assert [f.rsplit("/", 1)[1] for f in files] == ["node0.jsonl", "node1.jsonl"]
    nodes = [read_node(f) for f in files]
    assert nodes[1].skipped == 1
    ok, line, failures = verdict(nodes)
    assert ok and line == "succeeded after 1 restart(s)"
    assert failures[0].startswith("rank 1 on node1 (h1, group rank 1) exited with code 7")
    page = render(nodes)
    assert page.count('class="lane"') == 2 and "spare_took_over" in page and "straggler: rank 0" in page
    assert "goodput 70.0 % of 10.0 s" in page and "job (2 nodes, mean)" in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    out = tmp_path / "r.html"
    assert report_main([str(tmp_path)], str(out)).startswith(f"wrote {out}: 2 node(s)")


def test_a_failed_job_names_its_root_cause(tmp_path):
    rows = events(1, True)[:4] + [
        {"time": T + 9, "event": "finished", "state": "failed", "exit_code": 7, "restarts": 0}
    ]
    write(tmp_path / "events.jsonl", rows)
    ok, line, _ = verdict([read_node(str(tmp_path / "events.jsonl"))])
    assert not ok and line.startswith("failed (exit code 7) after 0 restart(s); root cause: rank 1 on events")


def test_no_events_is_an_error(tmp_path):
    (tmp_path / "events.jsonl").write_text("")
    with pytest.raises(ValueError, match="no events"):
        report_main([str(tmp_path)], str(tmp_path / "r.html"))


def test_the_metrics_flags():
    assert cfg.parse_metrics("127.0.0.1", None) is None
    assert cfg.parse_metrics("127.0.0.1", "9100") == ("127.0.0.1", 9100)
    assert cfg.parse_metrics("[::1]", "0") == ("::1", 0)
    with pytest.raises(ConfigError, match="--metrics_port 'x' is not a port number"):
        cfg.parse_metrics("127.0.0.1", "x")
    with pytest.raises(ConfigError, match="--metrics_host"):
        cfg.parse_metrics(" ", "9100")
