"""A rank's random streams as one picklable value: torch's (CPU and the current CUDA device), Python's
`random` and NumPy's global one. A step's draws (dropout masks, a sampler's shuffle) follow from it, so
a step done again, or a replacement's first step, draws what the lost one drew only from the same value.
"""

from __future__ import annotations

import random
import sys
from array import array
from typing import Any

import torch

State = dict[str, Any]


def get() -> State:
    """This process's random streams now (a copy)."""
    version, internal, gauss = random.getstate()
    # Python's stream as bytes, not as its tuple of 625 ints: the state is recorded (walked for tensors,
    # pickled) several times a step, and that tuple was 90 % of the walk
    state: State = {"torch": torch.get_rng_state(), "python": (version, array("Q", internal).tobytes(), gauss)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    numpy = sys.modules.get("numpy")  # only where the script uses it: importing it costs 0.1 s
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def put(state: State) -> None:
    """Set this process's random streams to `state` (from `get`, here or in another rank)."""
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(array("Q", internal)), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())
    if "numpy" in state and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(state["numpy"])
