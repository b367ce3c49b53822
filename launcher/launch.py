"""`python -m launcher.launch`: torch.distributed.launch's interface on the launcher.

Like that tool, it appends `--local-rank=N` to the script's arguments unless `--use_env`
(or `--use-env`) is given; everything else is the launcher's own command line.
"""

from __future__ import annotations

import sys

from .cli.commands import command
from .cli.commands import main as _main


def main(argv: list[str] | None = None) -> None:
    command.context_settings["default_map"] = {"append_local_rank": True}
    _main(argv, prog_name="launcher.launch")


if __name__ == "__main__":
    main(sys.argv[1:])
