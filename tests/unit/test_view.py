"""The live view as text: `render` of hand-built snapshots, drawn by rich into a string."""

from __future__ import annotations

import io
import re
import signal

from launcher.spec import GroupState, Snapshot, WorkerRow


def test_view_renders_a_table():
    from rich.console import Console

    from launcher.cli.view import render

    snap = Snapshot(
        GroupState.RUNNING,
        round=3,
        restarts=1,
        workers=[
            WorkerRow(rank=0, local_rank=0, pid=111, state="running", started=0.0, last_line="epoch 2 loss 0.5"),
            WorkerRow(rank=1, local_rank=1, pid=112, state="failed", started=0.0, last_line="Traceback"),
        ],
    )
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(render(snap, lambda pid: (12.0, 50 * 2**20), now=75.0))
    text = out.getvalue()
    assert "round 3 · running · 1 restart(s)" in text
    assert re.search(r"0 │\s+111 │ running │\s+12 │\s+50 MiB │\s+1 │\s+1:15 │ epoch 2 loss 0.5", text), text
    assert "failed" in text and "Traceback" in text


def test_live_view_renders_a_signalled_round_as_stopped_by_the_signal():
    from rich.console import Console

    from launcher.cli.view import render
    from launcher.spec import GroupState, Snapshot

    def shown(snap):
        console = Console(file=io.StringIO(), width=120)
        console.print(render(snap, lambda pid: (None, None), 0.0))
        return console.file.getvalue()

    workers = [WorkerRow(rank=0, local_rank=0, pid=1, state="stopped", started=0.0)]
    assert "stopped by SIGINT" in shown(Snapshot(GroupState.FAILED, 0, 0, workers, signal=signal.SIGINT))
    assert "stopping on SIGTERM" in shown(Snapshot(GroupState.STOPPING, 0, 0, workers, signal=signal.SIGTERM))
    assert "· failed ·" in shown(Snapshot(GroupState.FAILED, 0, 0, workers))
