"""`launcher.record`: torch's `@record` error file, for scripts that do not import torch.distributed.elastic."""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def write_error_file(exc: BaseException, path: str | None = None) -> None:
    """Write `exc` as torch's error-file JSON to `path` or $TORCHELASTIC_ERROR_FILE."""
    path = path or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def record(fn: F) -> F:
    """Decorate `main`: an uncaught exception lands in the error file, so the launcher can show it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        faulthandler.enable(all_threads=True)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            write_error_file(exc)
            raise

    return wrapper  # type: ignore[return-value]
