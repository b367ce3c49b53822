"""The live view: on a terminal, a rich table of the workers redrawn in place under the logs.

Only this module imports rich. It reads `Snapshot`s; it never changes state. On a terminal it also
draws the failure summary as a panel. Off a terminal (Slurm, systemd, pipes) the launcher prints
plain lines instead and this module is not loaded.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import IO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..agent.logs import CONSOLE_LOCK
from ..spec import GroupState, Snapshot

STATE_STYLE = {"running": "green", "succeeded": "cyan", "failed": "bold red", "stopped": "yellow"}


class ProcessStats:
    """CPU % and RSS per pid, from psutil, with the CPU delta kept between refreshes."""

    def __init__(self):
        self._procs: dict[int, object] = {}

    def __call__(self, pid: int) -> tuple[float | None, int | None]:
        import psutil

        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
                proc.cpu_percent(None)  # the first call only starts the measurement
                return None, proc.memory_info().rss
            return proc.cpu_percent(None), proc.memory_info().rss
        except psutil.Error:
            self._procs.pop(pid, None)
            return None, None


def _worker_state(state: str, straggler: bool | None) -> Text:
    """A worker's state, marked when --straggler_threshold flagged it."""
    if straggler:
        return Text(f"{state} · straggler", style="bold yellow")
    return Text(state, style=STATE_STYLE.get(state, ""))


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _group_state(snap: Snapshot) -> str:
    """The group's state; a job ended by a signal was stopped by it, it did not fail."""
    if snap.signal is None or snap.state not in (GroupState.STOPPING, GroupState.FAILED):
        return snap.state.value
    name = signal.Signals(snap.signal).name
    return f"stopping on {name}" if snap.state is GroupState.STOPPING else f"stopped by {name}"


def render(snap: Snapshot, stats: Callable[[int], tuple[float | None, int | None]], now: float) -> Table:
    """The table for one snapshot (pure but for `stats`): tests render it into a file console."""
    title = f"round {snap.round} · {_group_state(snap)} · {snap.restarts} restart(s)"
    table = Table(
        title=title,
        title_justify="left",
        expand=True,
        header_style="bold",
        caption=snap.waiting or None,
        caption_justify="left",
    )
    for name, kw in (
        ("rank", {"justify": "right"}),
        ("pid", {"justify": "right"}),
        ("state", {}),
        ("cpu %", {"justify": "right"}),
        ("rss", {"justify": "right"}),
        ("restarts", {"justify": "right"}),
        ("uptime", {"justify": "right"}),
        ("last line", {"ratio": 1, "no_wrap": True, "overflow": "ellipsis"}),
    ):
        table.add_column(name, **kw)
    for w in snap.workers:
        cpu, rss = stats(w.pid) if w.state == "running" else (None, None)
        table.add_row(
            str(w.rank),
            str(w.pid),
            _worker_state(w.state, w.straggler),
            "" if cpu is None else f"{cpu:.0f}",
            "" if rss is None else f"{rss / 2**20:.0f} MiB",
            str(snap.restarts),
            _duration(now - w.started) if w.state == "running" else "",
            Text(w.last_line, overflow="ellipsis", no_wrap=True),
        )
    return table


class ConsoleWriter:
    """A bytes sink for the log router that prints above the live region."""

    def __init__(self, console: Console):
        self.console = console

    def write(self, data: bytes) -> None:
        self.console.print(
            Text(data.decode(errors="replace").rstrip("\n")), markup=False, highlight=False, soft_wrap=True
        )

    def flush(self) -> None:
        pass


class LiveView:
    """Owns a rich `Live`; `start()` and `stop()` are called by the composition root."""

    def __init__(
        self, snapshot: Callable[[], Snapshot], console: Console | None = None, refresh_per_second: float = 2.0
    ):
        self.console = console or Console(stderr=True)
        self._snapshot = snapshot
        self._stats = ProcessStats()
        self._live = Live(
            get_renderable=self._render,
            console=self.console,
            refresh_per_second=refresh_per_second,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def _render(self) -> Table:
        return render(self._snapshot(), self._stats, time.monotonic())

    def writer(self) -> IO[bytes]:
        return ConsoleWriter(self.console)  # type: ignore[return-value]

    def start(self) -> None:
        self._live.start()

    def stop(self) -> None:
        self._live.stop()


def _age(seconds: object) -> str:
    return "" if not isinstance(seconds, (int, float)) else f"{seconds:.0f} s"


def _known(count: object) -> str:
    return "?" if count is None else str(count)


def render_status(job: dict) -> Table:
    """`launcher status` as one table: a row per rank under its node's row (pure: tests render it)."""
    used = "?" if job.get("restarts", 0) is None else job.get("restarts", 0)  # None: the counter holds no number
    budget = f"{used} of {job['max_restarts']}" if job.get("max_restarts") is not None else str(used)
    title = f"job {job['run_id']} · {job['state']} · round {job.get('round', '-')} · restarts {budget}"
    if job.get("forming"):
        title += f" · round {job['forming']['round']} forming, {_known(job['forming']['joined'])} joined"
    caption = []
    if job.get("closed"):
        caption.append(f"closed: {job['closed']}")
    v = job.get("verdict")
    if v:
        caption.append(
            f"root cause: rank {v['rank']} (local rank {v['local_rank']}) on {v['host']}, "
            f"exit {v['returncode']}: {v['error']}"
        )
    if job.get("stragglers"):
        caption.append("stragglers: " + ", ".join(f"rank {r}" for r in job["stragglers"]))
    gp = job.get("goodput")
    if gp:
        how = "; provisional: a first step is awaited" if gp.get("provisional") else ""
        caption.append(f"goodput {100 * gp['goodput']:.1f} % of the machine time ({gp['nodes']} node(s){how})")
    for q in job.get("quarantined", ()):
        caption.append(f"quarantined: {q['host']} ({q['why']})")
    table = Table(
        title=title,
        title_justify="left",
        caption="\n".join(caption) or None,
        caption_justify="left",
        expand=False,
        header_style="bold",
    )
    for name in ("node / rank", "host", "state", "heartbeat", "pid", "restarts", "progress", "step", "steps/s"):
        table.add_column(name, justify="right" if name in ("pid", "restarts", "step", "steps/s") else "left")
    for n in job["nodes"]:
        table.add_row(
            Text(f"node {n['group_rank']}", style="bold"),
            n["host"],
            Text(n["state"], style=STATE_STYLE.get(n["state"], "")),
            _age(n.get("heartbeat_age")) + " ago",
            "",
            "",
            "",
            "",
            "",
        )
        for w in n["workers"]:
            table.add_row(
                f"  rank {w['rank']}",
                "",
                _worker_state(w["state"], w.get("straggler")),
                "",
                str(w["pid"]),
                str(w["restarts"]),
                _age(w.get("progress_age")) + (" ago" if w.get("progress_age") is not None else ""),
                "" if w.get("step") is None else str(w["step"]),
                "" if w.get("rate") is None else f"{w['rate']:.2f}",
            )
    for spare in job.get("spares", []):
        table.add_row(
            Text("spare", style="bold"),
            spare["host"],
            f"waiting {_age(spare.get('waiting'))}",
            "",
            spare["node"].rsplit(":", 1)[-1],
            "",
            "",
            "",
            "",
        )
    if not job["nodes"]:
        table.add_row(
            "",
            "",
            _no_nodes(job),
            "",
            "",
            "",
            "",
            "",
            "",
        )
    return table


def _no_nodes(job: dict) -> str:
    """The status table's one row when no node's snapshot is there yet: what the job is waiting for."""
    if job["state"] == "absent":
        return "no such job in this store"
    if job.get("forming"):
        f = job["forming"]
        return f"round {f['round']} is forming ({f['joined']} joined); nodes show once it runs"
    if job["state"] == "running":
        return f"round {job.get('round', '-')} just formed: waiting for its nodes to start their workers and report"
    return "no node reported in the last round"


def show_status(job: dict) -> None:
    """Print `launcher status`'s table on stdout (plain text when stdout is not a terminal)."""
    console = Console()
    (console if console.is_terminal else Console(width=160)).print(render_status(job))  # a pipe gets whole columns


def print_panel(lines: list[str]) -> None:
    """The failure summary on a terminal: its first line as the title of a red panel, on stderr."""
    from rich.panel import Panel

    body = Text("\n".join(lines[1:]))
    with CONSOLE_LOCK:
        Console(stderr=True).print(Panel(body, title=f"[bold red]{lines[0]}", title_align="left", border_style="red"))
