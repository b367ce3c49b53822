"""The workers' memory folder (`inplace.keys.SLOTS_VAR`): where each rank keeps its own state (its random
streams for in place, the copy of its kept state for any restart: worker/inplace/memory.py).

The agent makes a private folder (mode 0700) in /dev/shm, named for the run and
the agent's pid, exports its path to every worker, and removes it when it exits, however it ends; the
guard (`process.Guard.remove`) removes it when the agent dies by SIGKILL. Where /dev/shm is missing (or
cannot be written), the folder is made in the run's folder instead.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile

log = logging.getLogger(__name__)
SHM = "/dev/shm"


def make(run_id: str, fallback: str, shm: str = SHM) -> str:
    """A new private folder for this agent's workers: in `shm` (memory), else under `fallback`."""
    name = re.sub(r"[^\w.-]", "_", run_id)[:64]  # any run id makes a valid folder name
    prefix = f"launcher-{name}-{os.getpid()}-"
    if os.path.isdir(shm):
        try:
            return tempfile.mkdtemp(prefix=prefix, dir=shm)  # mode 0700, a name nobody can take first
        except OSError as e:
            log.warning(f"cannot make the workers' memory folder in {shm} ({e.strerror or e}); using {fallback}")
    return tempfile.mkdtemp(prefix=prefix, dir=fallback)


def remove(path: str) -> None:
    """Remove the folder and what the workers left in it (nothing where it is gone already)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # it holds memory until someone removes it: say where
        log.warning(f"cannot remove the workers' memory folder {path}: {e.strerror or e}")
