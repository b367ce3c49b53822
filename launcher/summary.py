"""The failure summary as lines: the root cause first, with its traceback; collateral apart (printed by `run`)."""

from __future__ import annotations

from .spec import Failure, RunResult


def read_error_file(path: str | None) -> tuple[str, str]:
    """(message, traceback) from a torch `@record` / `launcher.record` error file; empty if none."""
    if not path:
        return "", ""
    import json  # only a failure gets here

    try:
        with open(path) as f:
            data = json.load(f)
        msg = data["message"]
        if isinstance(msg, str):
            return msg, ""
        return str(msg.get("message", "")), str(msg.get("extraInfo", {}).get("py_callstack", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "", ""


def _who(f: Failure) -> str:
    return f"rank {f.worker.rank} (local rank {f.worker.local_rank}) on {f.host}, pid {f.pid}"


def summary_lines(result: RunResult) -> list[str]:
    """The summary as plain lines; empty when there is nothing to explain."""
    root = result.root_cause
    if result.exit_code == 0 or (root is None and not result.message and not result.verdict):
        return []
    lines = [f"job failed (exit code {result.exit_code}) after {result.restarts} restart(s)"]
    v = result.verdict
    if v:  # the job's root cause, on another node: first, whatever happened here
        lines.append(f"root cause (remote, node {v.node}): {v.describe()}")
        if v.error:
            lines.append(f"  error: {v.error}")
        if v.log:
            lines.append(f"  log: {v.log} (on {v.host})")
    if result.message:
        lines.append(f"reason: {result.message}")
    if root:
        lines.append(f"{'also failed here' if v else 'root cause'}: {_who(root)} {root.reason or root.exit.describe()} (attempt {root.round})")
        message, trace = read_error_file(root.error_file)
        if message:
            lines.append(f"  error: {message}")
        if trace:
            lines.append("  traceback:")
            lines += ["    " + t for t in trace.rstrip().splitlines()]
        for path in root.log_files:
            lines.append(f"  log: {path}")
        if root.error_file:
            lines.append(f"  error file: {root.error_file}")
    others = [f for f in result.failures if not f.collateral and f is not root and f.round == (root.round if root else -1)]
    for f in others:
        lines.append(f"also failed: {_who(f)} {f.exit.describe()}")
    stopped = [f for f in result.failures if f.collateral and f.round == (root.round if root else -1)]
    if stopped:
        lines.append("stopped by the launcher: " + ", ".join(f"rank {f.worker.rank} (pid {f.pid})" for f in stopped))
    return lines

