"""In-place recovery, the worker's side (`python -m launcher --recovery in-place`; docs/in-place.md).

    from launcher.worker.inplace import Job

    job = Job()                                  # joins the round's process group
    job.keep(model=model, optimizer=optimizer)   # what a newcomer receives from a survivor
    job.ddp(model)                               # job.model: DDP, made again after each recovery
    for step in job.steps(args.steps):           # or job.steps(loader) in `for epoch in job.epochs(...)`
        with step:
            ...                                  # forward, backward, optimizer step (the commit) on job.model
    job.close()                                  # the job's end, where every rank meets

Importing this package imports no torch; `Job` does (`keys` is what the agent shares with it).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from .job import Job, Recovery, Step

__all__ = ["Job", "Recovery", "Step"]


def __getattr__(name: str):
    if name in __all__:
        from . import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
