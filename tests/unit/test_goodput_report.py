"""`launcher report`'s page from scripted events files (in-process), and the metrics flags' parsing."""

import json

import pytest

from launcher import config as cfg
from launcher.cli.report import _segments, find_files, read_node, render, report_main, verdict
from launcher.errors import ConfigError
from launcher.telemetry.goodput import Breakdown

T = 1_800_000_000.0
JOB = Breakdown(wall=10.0, training=7.0, restart=2.0, rendezvous=1.0, restarts=1, steps_known=True, nodes=2)
NODE = Breakdown(wall=52.0, training=50.0, restart=0.5, rendezvous=1.5, restarts=1, steps_known=True)


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


def spare_job() -> list[list[dict]]:
    """Events of a 2-node job with a spare whose member of group rank 1 was SIGKILLed (as recorded)."""
    a = [
        (0.00, "rendezvous", {"cause": "start"}),
        (0.36, "starting", {"round": 0, "restarts": 0}),
        (0.37, "running", {"round": 0, "restarts": 0, "group_rank": 0, "group_world_size": 2}),
        (15.0, "membership", {"reason": "node with group rank 1 died (its connections to the store closed)"}),
        (15.0, "stopping", {"reason": "membership"}),
        (15.1, "exit", {"rank": 0, "returncode": -15, "how": "killed by SIGTERM", "collateral": True}),
        (15.1, "rendezvous", {"cause": "membership"}),
        (15.2, "starting", {"round": 1, "restarts": 1}),
        (15.3, "running", {"round": 1, "restarts": 1, "group_rank": 0, "group_world_size": 2}),
        (52.0, "exit", {"rank": 0, "returncode": 0, "how": "exited with code 0", "collateral": False}),
        (52.0, "goodput", {"host": "h0", "node": NODE.to_dict(), "job": JOB.to_dict(), "why": ""}),
        (52.0, "finished", {"state": "succeeded", "exit_code": 0, "restarts": 1}),
    ]
    b = [
        (0.30, "rendezvous", {"cause": "start"}),
        (0.36, "starting", {"round": 0, "restarts": 0}),
        (0.38, "running", {"round": 0, "restarts": 0, "group_rank": 1, "group_world_size": 2}),
    ]
    spare = [
        (0.70, "rendezvous", {"cause": "start"}),
        (0.71, "waiting", {"what": "spare", "line": "waiting as a spare: round 0 is full (2 of 2 nodes)"}),
        (15.2, "starting", {"round": 1, "restarts": 1}),
        (15.3, "running", {"round": 1, "restarts": 1, "group_rank": 1, "group_world_size": 2}),
        (52.0, "exit", {"rank": 1, "returncode": 0, "how": "exited with code 0", "collateral": False}),
        (52.0, "goodput", {"host": "h2", "node": NODE.to_dict(), "job": JOB.to_dict(), "why": ""}),
        (52.1, "finished", {"state": "succeeded", "exit_code": 0, "restarts": 1}),
    ]
    return [[{"time": T + t, "event": k, **f} for t, k, f in node] for node in (a, b, spare)]


def test_a_spare_that_replaced_a_killed_node(tmp_path):
    for name, rows in zip(("a", "b", "spare"), spare_job()):
        write(tmp_path / f"{name}.jsonl", rows)
    nodes = [read_node(f) for f in find_files([str(tmp_path)])]
    page = render(nodes)  # marks the lost node first
    ok, line, failures = verdict(nodes)
    assert ok and line == "succeeded after 1 restart(s); 1 node lost on the way", line
    assert failures == ["b (group rank 1) lost: node with group rank 1 died (its connections to the store closed)"
                        " (seen by a) at 08:00:15.0"]  # fmt: skip
    lane = _segments(nodes[1], T + 52.1)
    assert lane[-1] == (T + 0.38, T + 15.0, "running"), "the lost node runs until it was lost, not to the end"
    assert "spare took over group rank 1 in round 1 (restart 1)" in page and "spare: waiting as a spare" in page
    assert page.count("<tr>") == 1 + 2 + 3, "the header, the job (every node; as agreed) and each of 3 nodes"
    assert "b (group rank 1) (lost at +14.7 s; from its events)" in page
    assert "job (all 3 nodes, mean)" in page and "as agreed (2 nodes of the last round)" in page


def test_a_spare_never_called_shows_its_standby_apart_and_is_not_in_the_jobs_figure(tmp_path):
    member = [
        (0.0, "rendezvous", {"cause": "start"}),
        (0.3, "running", {"round": 0, "restarts": 0, "group_rank": 0, "group_world_size": 1}),
        (52.0, "goodput", {"host": "h0", "node": NODE.to_dict(), "job": None, "why": ""}),
        (52.0, "finished", {"state": "succeeded", "exit_code": 0, "restarts": 0}),
    ]
    stood = Breakdown(standby=51.3)
    spare = [
        (0.7, "rendezvous", {"cause": "start"}),
        (0.71, "waiting", {"what": "spare", "line": "waiting as a spare: round 0 is full (1 of 1 nodes)"}),
        (52.0, "goodput", {"host": "h1", "node": stood.to_dict(), "job": None, "why": "this node ran no round"}),
        (52.0, "finished", {"state": "succeeded", "exit_code": 0, "restarts": 0}),
    ]
    for name, rows in (("a", member), ("spare", spare)):
        write(tmp_path / f"{name}.jsonl", [{"time": T + t, "event": k, **f} for t, k, f in rows])
    page = render([read_node(f) for f in find_files([str(tmp_path)])])
    assert f"<p>{NODE.line()}</p>" in page, "the job's figure is the member's: the standby is not the job's time"
    assert "spare standing by (apart)</th>" in page and "<td>51.3 s</td></tr>" in page
    assert page.count("<tr>") == 1 + 1 + 2, "the header, the job and each node (the spare's row shows its standby)"
