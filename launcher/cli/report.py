"""`launcher report EVENTS_FILE...`: one self-contained HTML page from the nodes' events files (a
timeline per node, the goodput breakdown, the job's verdict). Inline CSS and SVG, no script and no
network at view time: it opens from a mail attachment or an air-gapped cluster as it is.

Reading is forgiving (a torn last line, another file in the folder): what does not parse as an
event is skipped and counted, never fatal.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..telemetry.accounting import Accountant
from ..telemetry.goodput import LOST, WORDS, Breakdown, Component, duration, total

log = logging.getLogger(__name__)

COLOURS = {
    "forming": "#b8bec6",
    "running": "#2e9d58",
    "stopping": "#e08a1e",
    Component.TRAINING: "#2e9d58",
    Component.STARTUP: "#8fb8de",
    Component.RENDEZVOUS: "#b8bec6",
    Component.RESTART: "#d9534f",
    Component.REDONE: "#f0ad4e",
    Component.STALL: "#8e44ad",
    Component.SHUTDOWN: "#6c757d",
}
MARKS = {  # event -> (colour, what the marker says)
    "exit": ("#c0392b", "failure"),
    "hang": ("#8e44ad", "hang"),
    "straggler": ("#d4ac0d", "straggler"),
    "membership": ("#2c7fb8", "membership"),
    "backoff": ("#555555", "restart backoff"),
    "policy_stop": ("#7f1d1d", "restart policy stopped the job"),
}
SPARE, LOST_MARK = "#16a085", "#111111"
DIED = re.compile(r"group rank (\d+) (?:died|lost)")  # a survivor's `membership` reason for a lost node


@dataclass
class Node:
    """One node's events file, read."""

    name: str
    events: list[dict] = field(default_factory=list)
    skipped: int = 0
    lost: tuple[float, str] | None = None  # (when, how): its events end without `finished` (see `find_lost`)

    @property
    def finished(self) -> bool:
        return any(e["event"] == "finished" for e in self.events)

    @property
    def end(self) -> float:
        """Its last moment known: its death as the others saw it, or its last event."""
        return max(self.lost[0], self.events[-1]["time"]) if self.lost else self.events[-1]["time"]

    @property
    def goodput(self) -> tuple[Breakdown | None, Breakdown | None]:
        """(this node's, the job's) from its last `goodput` event."""
        last = next((e for e in reversed(self.events) if e["event"] == "goodput"), None)
        if last is None:
            return None, None
        return Breakdown.from_dict(last.get("node")), Breakdown.from_dict(last.get("job"))

    def replayed(self) -> Breakdown:
        """Its breakdown from its events, to `end` (a node killed wrote none): the agent's accountant fed
        them on their own clock; without the workers' progress files, as a job without steps."""
        now = [self.events[0]["time"]]
        accountant = Accountant(lambda: [], clock=lambda: now[0])
        for e in self.events:
            now[0] = e["time"]
            accountant(e["event"], e)
        now[0] = self.end
        return accountant.finish()

    @property
    def label(self) -> str:
        host = next((e.get("host") for e in self.events if e["event"] == "goodput" and e.get("host")), None)
        ranks = sorted({e["group_rank"] for e in self.events if e["event"] == "running" and "group_rank" in e})
        who = f"group rank {', '.join(map(str, ranks))}" if ranks else "no round"
        return f"{self.name} ({host + ', ' if host else ''}{who})"


def find_files(paths: Iterable[str]) -> list[str]:
    """The events files named, and those under the folders named (*.jsonl, events*)."""
    out = []
    for path in paths:
        if os.path.isdir(path):
            for folder, _, names in sorted(os.walk(path)):
                out += [
                    os.path.join(folder, n)
                    for n in sorted(names)
                    if n.endswith((".jsonl", ".ndjson", ".events")) or n.startswith("events")
                ]
        else:
            out.append(path)
    return out


def read_node(path: str) -> Node:
    node = Node(os.path.basename(path).removesuffix(".jsonl"))
    with open(path, "rb") as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                node.skipped += bool(line.strip())
                continue
            if isinstance(event, dict) and isinstance(event.get("time"), (int, float)) and "event" in event:
                node.events.append(event)
            else:
                node.skipped += 1
    node.events.sort(key=lambda e: e["time"])
    return node


def find_lost(nodes: list[Node]) -> None:
    """Mark each node whose events end without `finished` while another node's go on: lost (killed, or
    its host gone) when a survivor saw its group rank die, else at its last event."""
    for node in nodes:
        if node.finished or not node.events:
            continue
        last = node.events[-1]["time"]
        if not any(e["time"] > last for n in nodes if n is not node for e in n.events):
            continue  # nothing after it: it may still be running
        ranks = [e.get("group_rank") for e in node.events if e["event"] == "running"]
        seen = [
            (e["time"], e.get("reason", ""), n.name)
            for n in nodes
            if n is not node
            for e in n.events
            if e["event"] == "membership" and e["time"] >= last and ranks and _died(e, ranks[-1])
        ]
        if seen:
            when, reason, by = min(seen)
            node.lost = (when, f"lost: {reason} (seen by {by})")
        else:
            node.lost = (last, "lost: its events end here, without `finished` (its agent was killed?)")


def _died(event: dict, group_rank: object) -> bool:
    found = DIED.search(str(event.get("reason", "")))
    return bool(found) and str(group_rank) == found.group(1)


def verdict(nodes: list[Node]) -> tuple[bool, str, list[str]]:
    """(succeeded, one line, the failures with their root cause first). The nodes that finished carry the
    job's verdict; a lost node (`find_lost`) is one of its failures, not a node that did not finish."""
    finished = [e for n in nodes for e in n.events if e["event"] == "finished"]
    found = [
        (e["time"], n, f"rank {e.get('rank')} on {n.label} {e.get('how', '')}")
        for n in nodes
        for e in n.events
        if e["event"] == "exit" and e.get("returncode") != 0 and not e.get("collateral")
    ]
    found += [(n.lost[0], n, f"{n.label} {n.lost[1]}") for n in nodes if n.lost]
    lines = [f"{what} at {_clock(t)}" for t, _, what in sorted(found, key=lambda x: x[0])]
    restarts = max((e.get("restarts", 0) for e in finished), default=0)
    unfinished = [n for n in nodes if not n.finished and not n.lost]
    ok = bool(finished) and all(e.get("exit_code") == 0 for e in finished) and not unfinished
    lost = sum(1 for n in nodes if n.lost)
    also = f"; {lost} node{'' if lost == 1 else 's'} lost on the way" if lost else ""
    if ok:
        return True, f"succeeded after {restarts} restart(s){also}", lines
    codes = sorted({e.get("exit_code") for e in finished if e.get("exit_code") != 0}, key=str)
    how = f"failed (exit code {', '.join(map(str, codes))})" if codes else "did not finish in these files"
    root = f"; root cause: {lines[0]}" if lines else ""
    return False, f"{how} after {restarts} restart(s){root}", lines


def _clock(t: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 10)}"


def _segments(node: Node, end: float) -> list[tuple[float, float, str]]:
    """(start, end, state) spans: forming, running, stopping."""
    spans, state, since = [], None, None
    for e in node.events:
        new = {"rendezvous": "forming", "running": "running", "stopping": "stopping", "finished": None}.get(
            e["event"], "same"
        )
        if new == "same":
            continue
        if state is not None:
            spans.append((since, e["time"], state))
        state, since = new, e["time"]
    if state is not None:
        spans.append((since, node.end if node.lost else end, state))
    return spans


def _marks(node: Node) -> list[tuple[float, str, str]]:
    """(time, colour, tooltip) for failures, hangs, stragglers, membership changes, restarts, spares, quarantine."""
    out, restarts, spare = [], 0, False
    for e in node.events:
        kind = e["event"]
        if kind == "exit" and (e.get("returncode") == 0 or e.get("collateral")):
            continue
        if kind == "waiting" and e.get("what") == "spare":
            spare = True
            out.append((e["time"], SPARE, f"spare: {e.get('line', 'waiting as a spare')}"))
        elif kind == "running" and spare:
            spare, restarts = False, e.get("restarts", 0)
            took = f"spare took over group rank {e.get('group_rank')} in round {e.get('round')}"
            out.append((e["time"], SPARE, f"{took} (restart {restarts})"))
        elif kind == "running" and e.get("restarts", 0) > restarts:
            restarts = e["restarts"]
            out.append((e["time"], "#1a5e33", f"restart {restarts}: round {e.get('round')}"))
        elif kind in MARKS:
            colour, word = MARKS[kind]
            detail = e.get("how") or e.get("reason") or (f"rank {e.get('rank')}" if "rank" in e else "")
            if kind in ("exit", "hang", "straggler"):
                detail = f"rank {e.get('rank')}: {detail}" if kind == "exit" else f"rank {e.get('rank')}"
            out.append((e["time"], colour, f"{word}: {detail}"))
        elif "spare" in kind or "quarantin" in kind:
            colour = SPARE if "spare" in kind else "#7f1d1d"
            fields = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event"))
            out.append((e["time"], colour, f"{kind}: {fields}"))
    if node.lost:
        out.append((node.lost[0], LOST_MARK, node.lost[1]))
    return out


def timeline(nodes: list[Node], width: int = 1000) -> str:
    """The SVG: one lane per node, the state spans and the markers, a time axis."""
    times = [e["time"] for n in nodes for e in n.events]
    t0, t1 = min(times), max(times)
    span = max(t1 - t0, 1e-3)
    left, lane, top = 230, 34, 10
    x = lambda t: left + (t - t0) / span * (width - left - 10)  # noqa: E731
    height = top + lane * len(nodes) + 30
    parts = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for i, node in enumerate(nodes):
        y = top + i * lane
        parts.append(f'<text x="4" y="{y + 18}" class="lane">{html.escape(node.label[:34])}</text>')
        for a, b, state in _segments(node, t1):  # a lost node's last span ends where it was lost
            tip = f"{state} {duration(b - a)} from {_clock(a)}"
            parts.append(
                f'<rect x="{x(a):.1f}" y="{y + 4}" width="{max(1.0, x(b) - x(a)):.1f}" height="{lane - 12}" '
                f'fill="{COLOURS[state]}"><title>{html.escape(tip)}</title></rect>'
            )
        placed: list[float] = []
        for t, colour, tip in _marks(node):
            cx = x(t)
            while any(abs(cx - p) < 9 for p in placed):  # markers at one moment side by side, not on top
                cx += 9
            placed.append(cx)
            parts.append(
                f'<path d="M{cx - 5:.1f},{y} L{cx + 5:.1f},{y} L{cx:.1f},{y + 9} Z" fill="{colour}" stroke="#fff">'
                f"<title>{html.escape(tip)}</title></path>"
            )
    y = top + lane * len(nodes) + 4
    for k in range(6):
        t = t0 + span * k / 5
        parts.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{y}" class="grid"/>')
        anchor = "end" if k == 5 else "middle" if k else "start"
        parts.append(
            f'<text x="{x(t):.1f}" y="{y + 14}" text-anchor="{anchor}" class="tick">+{duration(t - t0)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def goodput_bar(b: Breakdown, width: int = 1000) -> str:
    """One stacked bar of the components, with its legend below (in the table)."""
    parts, x = [f'<svg id="goodput" xmlns="http://www.w3.org/2000/svg" width="{width}" height="28">'], 0.0
    for c in (Component.TRAINING, *LOST):
        w = b.seconds(c) / b.wall * width if b.wall > 0 else 0.0
        if w > 0:
            tip = f"{WORDS[c]} {duration(b.seconds(c))} ({100 * b.seconds(c) / b.wall:.1f} %)"
            parts.append(
                f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="28" fill="{COLOURS[c]}"><title>{tip}</title></rect>'
            )
            x += w
    parts.append("</svg>")
    return "".join(parts)


def goodput_table(rows: list[tuple[str, Breakdown]]) -> str:
    short = {Component.RENDEZVOUS: "rendezvous", Component.REDONE: "re-done"}
    head = "".join(
        f'<th><span class="key" style="background:{COLOURS[c]}"></span>{short.get(c, WORDS[c])}</th>' for c in Component
    )
    body = []
    for name, b in rows:
        cells = "".join(f"<td>{duration(b.seconds(c))}</td>" for c in Component)
        body.append(
            f"<tr><td>{html.escape(name)}</td><td><b>{100 * b.goodput:.1f} %</b></td><td>{duration(b.wall)}</td>"
            f"{cells}<td>{b.restarts}</td><td>{b.redone_steps if b.steps_known else '?'}</td>"
            f"<td>{duration(b.standby) if b.standby else ''}</td></tr>"
        )
    return (  # a spare's standby is apart: outside the wall time and the figure
        f"<table><tr><th></th><th>goodput</th><th>wall</th>{head}<th>restarts</th><th>steps re-done</th>"
        '<th class="muted">spare standing by (apart)</th></tr>' + "".join(body) + "</table>"
    )


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1040px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
.ok{color:#1e7b43} .bad{color:#b02a2a} .lane{font-size:12px} .tick{font-size:11px;fill:#555}
.grid{stroke:#ddd} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 6px;white-space:nowrap}
th{background:#f5f5f5;font-weight:600} .key{display:inline-block;width:10px;height:10px;margin-right:4px}
.legend span{margin-right:10px;white-space:nowrap} .muted{color:#666}
"""


def render(nodes: list[Node]) -> str:
    """The page."""
    find_lost(nodes)
    ok, line, failures = verdict(nodes)
    agreed = next((j for n in nodes for _, j in [n.goodput] if j is not None), None)
    per_node, replayed, members = [], 0, []
    for n in nodes:
        mine, ran = n.goodput[0], any(e["event"] == "running" for e in n.events)
        if mine is None and ran:  # killed, or still running
            mine, replayed = n.replayed(), replayed + 1
            lost = f"lost at +{duration(n.end - n.events[0]['time'])}; " if n.lost else ""
            per_node.append((f"{n.label} ({lost}from its events)", mine))
        elif mine is not None:
            per_node.append((n.label, mine))
        if mine is not None and ran:
            members.append(mine)
    rows = [*per_node]
    job = agreed
    if replayed or (job is None and members):  # the machine time of every node in these files that ran a round
        job = total(members)  # (a spare never called stood by: its row shows it, apart)
        if agreed is not None:
            rows.insert(0, (f"as agreed ({agreed.nodes} nodes of the last round)", agreed))
    times = [e["time"] for n in nodes for e in n.events]
    legend = "".join(
        f'<span><span class="key" style="background:{c}"></span>{w}</span>'
        for w, c in [
            ("forming a round", COLOURS["forming"]),
            ("workers running", COLOURS["running"]),
            ("stopping", COLOURS["stopping"]),
            ("▼ failure", MARKS["exit"][0]),
            ("▼ restart", "#1a5e33"),
            ("▼ membership", MARKS["membership"][0]),
            ("▼ straggler", MARKS["straggler"][0]),
            ("▼ hang", MARKS["hang"][0]),
            ("▼ spare", SPARE),
            ("▼ node lost", LOST_MARK),
            ("▼ quarantine", "#7f1d1d"),
        ]
    )
    skipped = sum(n.skipped for n in nodes)
    body = [
        f'<h1>Job report <span class="{"ok" if ok else "bad"}">{html.escape(line)}</span></h1>',
        f'<div class="muted">{len(nodes)} node(s), {_clock(min(times))} to {_clock(max(times))} UTC'
        + (f"; {skipped} line(s) that were not events skipped" if skipped else "")
        + "</div>",
        "<h2>Timeline</h2>",
        timeline(nodes),
        f'<div class="legend">{legend}</div>',
    ]
    if failures:
        body += ["<h2>Failures (root cause first)</h2><ol>"] + [f"<li>{html.escape(f)}</li>" for f in failures]
        body.append("</ol>")
    body.append("<h2>Goodput</h2>")
    if job is not None:
        body += [f"<p>{html.escape(job.line())}</p>", goodput_bar(job)]
        head = "job" + (f" ({'all ' if replayed else ''}{job.nodes} nodes, mean)" if job.nodes > 1 else "")
        body.append(goodput_table([(head, job), *rows]))
    else:
        body.append('<p class="muted">no goodput event in these files (an older launcher, or a node killed).</p>')
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>launcher report</title>'
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )


def report_main(paths: list[str], output: str) -> str:
    """Write the page for the events files under `paths` to `output`; returns what was done, in one line."""
    files = find_files(paths)
    nodes = [n for n in map(read_node, files) if n.events]
    if not nodes:
        raise ValueError(f"no events in {', '.join(paths)} (give --events_file files, or the folders that hold them)")
    with open(output, "w") as f:
        f.write(render(nodes))
    return f"wrote {output}: {len(nodes)} node(s), {sum(len(n.events) for n in nodes)} events"
