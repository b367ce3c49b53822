"""launcher: a torchrun-compatible launcher and elastic rendezvous for PyTorch distributed training."""

from .worker.progress import progress  # re-exported: `launcher.progress` is the public name

__version__ = "0.1.0"
__all__ = ["__version__", "progress", "record"]


def record(fn):
    """torch's `@record` without importing torch: see `launcher.worker.errorfile.record`."""
    from .worker.errorfile import record as _record

    return _record(fn)
