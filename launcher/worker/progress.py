"""`launcher.progress(step=)`: a worker tells its agent it is making progress (the `--hang_timeout`
heartbeat) and which step it has done (the step rate of `launcher status`, the straggler judge, and
where goodput's start-up and restarts end).

A script that uses `inplace.Job` need not call it: the Job reports its committed steps (`job_step`),
unless the script reports its own (one call with a step is enough: from then on only its own are
written, so the two counts never mix in one process).
"""

import os

_script_steps = False  # this process's script called progress(step=) itself


def progress(step: int | None = None) -> None:
    """Tell the launcher this worker is making progress (see --hang_timeout); cheap, never fails.

    `step`: the training step just done; the launcher derives the rank's step rate from it (shown by
    `launcher status`, and compared with the job's median by --straggler_threshold)."""
    global _script_steps
    if step is not None:
        _script_steps = True
    _write(step)


def job_step(step: int, committed: int) -> None:
    """`inplace.Job`'s step `step` committed, its `committed`-th in this process: reported, unless the
    script reports its own steps. Not the first: a script that reports its own each step has done so by
    the second, and the two counts (the script's may be offset) are never both written."""
    if not _script_steps and committed > 1:
        _write(step)


def _write(step: int | None) -> None:
    path = os.environ.get("LAUNCHER_PROGRESS_FILE")
    if path and step is not None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, b"%20d\n" % int(step), 0)  # one fixed-width write: a reader never sees half
            finally:
                os.close(fd)
        except (OSError, ValueError, TypeError):
            pass
    elif path:
        try:
            os.utime(path)
        except FileNotFoundError:
            try:
                open(path, "a").close()
            except OSError:  # its folder is gone or read-only: the launcher watches output instead
                pass
        except OSError:
            pass
