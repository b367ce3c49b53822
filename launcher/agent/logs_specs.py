"""Where a round's worker logs go: the launcher's own layout, or a torch `LogsSpecs` plugin's.

`--logs_specs NAME` names a class on the `torchrun.logs_specs` entry point (torch's `LogsSpecs`:
constructed with log_dir, redirects, tee and local_ranks_filter; `reify(envs)` gives each local
rank's stdout/stderr files, which of them are tee'd to the console, and its error file). Loading it
imports torch, so this happens only for a named plugin; `default` is our own layout, which is
torch's DefaultLogsSpecs' (`<log_dir>/<run_id>_*/attempt_N/<local_rank>/{stdout,stderr}.log`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .. import plugins
from ..errors import LauncherError

log = logging.getLogger(__name__)
GROUP = "torchrun.logs_specs"


@dataclass(frozen=True)
class RankLogs:
    """One local rank's destinations for a round: files (None: none) and whether each stream shows."""

    stdout: str | None
    stderr: str | None
    stdout_console: bool
    stderr_console: bool
    error_file: str
    traceback: str | None = None  # where a collateral traceback goes when stderr has no file (logs.TRACEBACK)


@dataclass(frozen=True)
class Placement:
    """A round's log destinations: per local rank, and the attempt's filtered_std{out,err}.log."""

    ranks: dict[int, RankLogs]
    filtered_stdout: str | None = None
    filtered_stderr: str | None = None


class PluginLogs:
    """A `torchrun.logs_specs` class, driven as torch's agent drives it: one `reify` per round."""

    def __init__(self, name: str, log_dir: str | None, redirects, tee, local_ranks_filter, nproc: int):
        try:
            cls = plugins.load(GROUP, name)
            from torch.distributed.elastic.multiprocessing.api import Std as TorchStd

            def std(ours) -> object:
                return {r: TorchStd(ours.for_rank(r)) for r in range(nproc)}

            self.spec = cls(
                log_dir=log_dir,
                redirects=std(redirects),
                tee=std(tee),
                local_ranks_filter=set(local_ranks_filter) if local_ranks_filter is not None else None,
            )
        except Exception as e:  # a plugin that cannot load must say so and stop the job, not hang it
            raise LauncherError(f"--logs_specs {name}: cannot load it: {type(e).__name__}: {e}") from e
        self.name = name

    def place(self, envs: Mapping[int, dict[str, str]]) -> Placement:
        """Each local rank's destinations; sets TORCHELASTIC_ERROR_FILE in `envs` as torch's agent does."""
        dest = self.spec.reify(dict(envs))
        out: dict[int, RankLogs] = {}
        for r, env in envs.items():
            out[r] = RankLogs(
                stdout=_file(dest.stdouts.get(r)),
                stderr=_file(dest.stderrs.get(r)),
                stdout_console=dest.stdouts.get(r) == "" or r in dest.tee_stdouts,
                stderr_console=dest.stderrs.get(r) == "" or r in dest.tee_stderrs,
                error_file=dest.error_files.get(r, "") or env.get("TORCHELASTIC_ERROR_FILE", ""),
            )
            env["TORCHELASTIC_ERROR_FILE"] = out[r].error_file
        filtered = (_file(getattr(dest, "filtered_stdout", None)), _file(getattr(dest, "filtered_stderr", None)))
        return Placement(out, *filtered)


def default_placement(routing, attempt: str, envs: Mapping[int, dict[str, str]]) -> Placement:
    """The launcher's layout: `attempt/<local_rank>/{stdout,stderr}.log` where a stream goes to a file
    (`logs.Routing.destinations`), `attempt/<local_rank>/error.json`, `attempt/filtered_std*.log`."""
    ranks = {}
    for r, env in envs.items():
        folder = os.path.join(attempt, str(r))
        (out_console, out_file), (err_console, err_file) = (routing.destinations(r, s) for s in ("stdout", "stderr"))
        ranks[r] = RankLogs(
            stdout=os.path.join(folder, "stdout.log") if out_file else None,
            stderr=os.path.join(folder, "stderr.log") if err_file else None,
            stdout_console=out_console,
            stderr_console=err_console,
            error_file=env.get("TORCHELASTIC_ERROR_FILE") or os.path.join(folder, "error.json"),
            traceback=os.path.join(folder, "traceback.log"),
        )
    return Placement(ranks, os.path.join(attempt, "filtered_stdout.log"), os.path.join(attempt, "filtered_stderr.log"))


def _file(path: str | None) -> str | None:
    """torch's "" means the console, os.devnull nowhere: neither is a file to write."""
    return path if path and path != os.devnull else None
