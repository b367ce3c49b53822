"""How to install the launcher or one of its extras into this interpreter, as a hint's text.

From a checkout (the package sits beside setup.cfg) the command installs the checkout, editable:
the distribution's name is not on the package index until it is published, so `pip install
'torch-launcher[gpu]'` would fail there. Installed any other way, the command names the index's.
"""

from __future__ import annotations

import os
import sys

# The name on the package index (setup.cfg's; `launcher` there is another project)
DISTRIBUTION = "torch-launcher"
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # launcher/ -> the repository


def checkout() -> str | None:
    """The repository this package runs from, as a short path (None: not a checkout)."""
    if not os.path.isfile(os.path.join(CHECKOUT, "setup.cfg")):
        return None
    here = os.path.relpath(CHECKOUT)
    return CHECKOUT if here.startswith("..") else here


def command(extra: str = "") -> str:
    """The pip command that installs the launcher (with `extra`, one of setup.cfg's extras) here."""
    pip = f"{sys.executable} -m pip install"
    root = checkout()
    if root is not None:
        return f"{pip} -e '{root}[{extra}]'" if extra else f"{pip} -e {root}"
    return f"{pip} '{DISTRIBUTION}[{extra}]'" if extra else f"{pip} {DISTRIBUTION}"
