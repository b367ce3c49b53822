"""The launcher's run-time dependencies: a missing one is one line naming the fix, before anything starts.

Run from a checkout with the system `python3` instead of the project's venv, the workers would fail
on `import torch` and the launcher on its first lazy `import psutil`: this tells the user up front.
It only locates the modules (`importlib.util.find_spec`: a few stats), it imports none of them.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ..install import DISTRIBUTION, command

__all__ = ["DISTRIBUTION", "before_cli", "fix_hint", "missing", "problem"]

# What every launch needs in the launcher's own interpreter (the workers run in it too, unless
# --no_python): psutil stops worker trees, rich draws the live table and the summary.
NEEDED = ("click", "psutil", "rich")
WORKERS_NEED = ("torch",)
METRICS_NEED = ("prometheus_client",)  # --metrics_port (a plain dependency, imported only with the flag)


def missing(names: tuple[str, ...]) -> list[str]:
    """The modules of `names` this interpreter cannot import."""
    return [n for n in names if importlib.util.find_spec(n) is None]


def fix_hint() -> str:
    """How to get the dependencies: the checkout's venv when there is one, else pip."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # launcher/cli/ → the checkout
    venv = os.path.join(root, ".venv")
    here = os.path.relpath(venv) if not os.path.relpath(venv).startswith("..") else venv
    if os.path.isfile(os.path.join(venv, "bin", "python")):
        return f"activate the venv: source {here}/bin/activate (or run {here}/bin/python -m launcher)"
    if os.path.isfile(os.path.join(root, "scripts", "setup.sh")):
        return f"set up the venv: bash {os.path.relpath(root)}/scripts/setup.sh, then source {here}/bin/activate"
    return f"install the launcher into it: {command()}"


def problem(names: list[str]) -> str:
    """The one line for the modules `names` that are missing."""
    listed = " and ".join(", ".join(names).rsplit(", ", 1))
    verb = "is" if len(names) == 1 else "are"
    return f"{listed} {verb} not installed for {sys.executable}; {fix_hint()}"


def before_cli(first: str | None) -> str:
    """The line for an interpreter that cannot import the command line (`first`, click, was the first
    import to fail): every dependency a launch needs that is missing, not only the first one."""
    absent = missing(NEEDED + WORKERS_NEED)
    return problem(absent or [first or "a dependency"])
