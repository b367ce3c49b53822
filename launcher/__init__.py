"""launcher: a torchrun-compatible launcher and elastic rendezvous for PyTorch distributed training."""

__version__ = "0.1.0"


def record(fn):
    """torch's `@record` without importing torch: see `launcher.errorfile.record`."""
    from .errorfile import record as _record

    return _record(fn)
