"""The system programs some tests drive for real (etcd, Slurm, sshd, tmux, iproute2, chromium), found
in one place: `scripts/setup.sh --test` installs them as root on Debian, and with TEST_NO_SYSTEM=1 it
installs nothing and every test that needs one of them is skipped, saying so."""

from __future__ import annotations

import os
import shutil

NO_SYSTEM = os.environ.get("TEST_NO_SYSTEM", "") not in ("", "0")
SKIPPED = "TEST_NO_SYSTEM=1: the tests that need system packages are skipped"


def which(name: str) -> str | None:
    """The path of system program `name` (None: missing, or TEST_NO_SYSTEM=1)."""
    return None if NO_SYSTEM else shutil.which(name)


def unless_skipped(reason: str) -> str:
    """`reason` for a skip that needs a system package, or the TEST_NO_SYSTEM one where it is set."""
    return SKIPPED if NO_SYSTEM else reason


def missing(name: str, package: str) -> str:
    """A skip reason for `name`, which `package` provides."""
    return (
        SKIPPED
        if NO_SYSTEM
        else f"no {name} on PATH (scripts/setup.sh --test installs it as root: apt-get install {package})"
    )
