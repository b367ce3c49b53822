"""The exceptions the launcher raises on purpose (the exit-code table is `exitcodes.py`)."""

from __future__ import annotations

from .exitcodes import ExitCode
from .exitcodes import for_signal as exit_code_for_signal  # noqa: F401  (the name older modules import)

EXIT_OK = ExitCode.OK
EXIT_WORKERS_FAILED = ExitCode.FAILED
EXIT_USAGE = ExitCode.USAGE


class LauncherError(Exception):
    """Base of every error the launcher raises on purpose."""

    exit_code = EXIT_WORKERS_FAILED


class ConfigError(LauncherError):
    """Bad flags or environment: one line on stderr, exit 2."""

    exit_code = EXIT_USAGE


class RendezvousError(LauncherError):
    """The nodes could not agree on a round."""


class RendezvousClosedError(RendezvousError):
    """The job was closed by another node (it finished, failed or gave up).

    `verdict`: the job's root cause as the closing node published it (a `spec.Verdict`), if any.
    `succeeded`: the job finished well (a spare, or a node that came late, ends with exit 0).
    """

    def __init__(self, message: str, verdict: object = None, succeeded: bool = False):
        super().__init__(message)
        self.verdict = verdict
        self.succeeded = succeeded


class RendezvousTimeoutError(RendezvousError):
    """Not enough nodes joined before the join timeout."""


class RendezvousConnectionError(RendezvousError):
    """The rendezvous store could not be reached."""


class RestartBudgetExhausted(RendezvousError):
    """A failure happened with no restart left in the job-wide budget."""
