"""The failure summary as lines: the root cause first, with its traceback; collateral apart (printed by `run`)."""

from __future__ import annotations

import os
import signal

from ..exitcodes import MEANING
from ..spec import Failure, RunResult


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


def copy_root_cause(result: RunResult, dest: str | None) -> str:
    """torchrun's `dump_error_file`: the root cause's error file, its exit code as `errorCode`,
    into the launcher's own $TORCHELASTIC_ERROR_FILE (what a scheduler that wraps it reads).
    Nothing without a root-cause error file; returns a one-line problem, or ""."""
    root, _ = causes(result)
    if not dest or root is None or not root.error_file:
        return ""
    import json

    try:
        with open(root.error_file) as f:
            data = json.load(f)
        if root.exit.returncode and isinstance(data.get("message"), dict):
            data["message"]["errorCode"] = root.exit.returncode
        if os.path.isfile(dest):
            os.remove(dest)
        with open(dest, "w") as f:
            json.dump(data, f)
    except (OSError, ValueError, AttributeError) as e:
        why = getattr(e, "strerror", None) or e
        return f"cannot copy the root cause's error file to TORCHELASTIC_ERROR_FILE={dest}: {why}"
    return ""


def causes(result: RunResult) -> tuple[Failure | None, Failure | None]:
    """(the root cause, an earlier failure a restart recovered from): a failure of a round before the
    one the group ended in is not why it ended (a signal, say, stopped the restarted round)."""
    root = result.root_cause
    if root is not None and result.round is not None and root.round < result.round:
        return None, root
    return root, None


def _who(f: Failure) -> str:
    return f"rank {f.worker.rank} (local rank {f.worker.local_rank}) on {f.host}, pid {f.pid}"


def summary_lines(result: RunResult, kept: str = "") -> list[str]:
    """The summary as plain lines; empty when there is nothing to explain.

    `kept`: the temporary folder left behind with the logs and error files, named last.
    """
    root, earlier = causes(result)
    if result.exit_code == 0 or (root is None and not (earlier or result.message or kept or result.verdict)):
        return []
    how = f"stopped by {signal.Signals(result.signal).name}" if result.signal else "failed"
    meaning = f": {MEANING[result.exit_code]}" if result.exit_code in MEANING else ""  # type: ignore[index]
    lines = [f"job {how} (exit code {int(result.exit_code)}{meaning}) after {result.restarts} restart(s)"]
    v = result.verdict
    if v:  # the job's root cause, on another node: first, whatever happened here
        lines.append(f"root cause (remote, node {v.node}): {v.describe()}")
        if v.error:
            lines.append(f"  error: {v.error}")
        if v.log:
            lines.append(f"  log: {v.log} (on {v.host})")
    if result.message:
        lines.append(f"reason: {result.message}")
    if result.quarantined:
        lines.append(f"quarantined: {', '.join(result.quarantined)}")
    if root:
        what = "also failed here" if v else "root cause"
        lines.append(f"{what}: {_who(root)} {root.reason or root.exit.describe()} (attempt {root.round})")
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
    last = root.round if root else result.round if earlier else -1  # the round the summary is about
    others = [f for f in result.failures if not f.collateral and f is not root and f.round == last]
    for f in others:
        lines.append(f"also failed: {_who(f)} {f.exit.describe()}")
    stopped = sorted((f for f in result.failures if f.collateral and f.round == last), key=lambda f: f.worker.rank)
    if stopped:
        pids = ", ".join(f"rank {f.worker.rank} (pid {f.pid})" for f in stopped)
        lines.append(f"stopped by the launcher: {pids}" + ("" if root else f" (attempt {last})"))
    if earlier:
        how = earlier.reason or earlier.exit.describe()
        lines.append(f"earlier, recovered by a restart: {_who(earlier)} {how} (attempt {earlier.round})")
    if kept:
        lines.append(f"logs and error files kept in {kept}")
    return lines
