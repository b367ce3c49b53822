"""DIE_AT="RANK STEP PHASE [DELAY], ...": where a test worker SIGKILLs itself, parsed once for the
in-place workers (in_place_exact.py, in_place_steps.py), each with its own phases."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Die:
    """One DIE_AT entry: that rank's first-round process SIGKILLs itself at `phase` of `step`, `delay` s in."""

    rank: int
    step: int
    phase: str
    delay: float = 0.0


def dies_of(text: str, phases: tuple[str, ...]) -> list[Die]:
    """DIE_AT's entries, in order; one that is not `RANK STEP PHASE [DELAY]` ends the worker, naming it."""
    found = []
    for entry in filter(None, (x.strip() for x in text.split(","))):
        parts = entry.split()
        try:
            if len(parts) not in (3, 4) or parts[2] not in phases:
                raise ValueError
            found.append(Die(int(parts[0]), int(parts[1]), parts[2], float(parts[3]) if len(parts) == 4 else 0.0))
        except ValueError:
            raise SystemExit(f"DIE_AT: {entry!r} is not 'RANK STEP PHASE [DELAY]' with PHASE one of {phases}") from None
    return found
