"""Stands in for `torch.distributed.run` (and `torch.distributed.launch`) in pytorch's own launcher
tests: each `main(args)` runs `python -m launcher ARGS` (or `python -m launcher.launch ARGS`) in a
child process and maps its exit code the way torchrun's `main` ends:

    0 -> returns;  2 (bad input) -> ValueError;  anything else -> torch's ChildFailedError.

The child's stdout and stderr are copied to this process's `sys.stdout` / `sys.stderr` (the tests
capture them with `redirect_stdout`). Used by `scripts/torch_launcher_tests.sh` only; never shipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

EXIT_USAGE = 2


def _run(module: str, args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, env=dict(os.environ))
    sys.stdout.write(proc.stdout.decode(errors="replace"))
    sys.stderr.write(proc.stderr.decode(errors="replace"))
    sys.stdout.flush()
    sys.stderr.flush()
    if proc.returncode == 0:
        return
    if proc.returncode == EXIT_USAGE:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
        raise ValueError(last)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=proc.returncode, exitcode=proc.returncode, error_file="")
    raise ChildFailedError(name=f"python -m {module}", failures={0: failure})


def main(args: list[str] | None = None) -> None:
    """torch.distributed.run.main"""
    _run("launcher", list(sys.argv[1:] if args is None else args))


def parse_min_max_nnodes(nnodes: str) -> tuple[int, int]:
    """torch.distributed.run.parse_min_max_nnodes: the launcher's own parser; torch raises RuntimeError."""
    from launcher.errors import ConfigError
    from launcher.parsers import parse_nnodes

    try:
        return parse_nnodes(nnodes)
    except ConfigError as e:
        raise RuntimeError(str(e)) from None


legacy = types.SimpleNamespace(main=lambda args=None: _run("launcher.launch", list(args or [])))
"""torch.distributed.launch"""
