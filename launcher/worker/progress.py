"""`launcher.progress(step=)`: a worker tells its agent it is making progress (the `--hang_timeout`
heartbeat) and which step it has done (the step rate of `launcher status` and the straggler judge)."""

import os


def progress(step: int | None = None) -> None:
    """Tell the launcher this worker is making progress (see --hang_timeout); cheap, never fails.

    `step`: the training step just done; the launcher derives the rank's step rate from it (shown by
    `launcher status`, and compared with the job's median by --straggler_threshold)."""
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
