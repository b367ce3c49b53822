"""`python -m launcher.launch`: torch.distributed.launch's interface on the launcher.

Like that tool, it appends `--local-rank=N` to the script's arguments unless `--use_env`
(or `--use-env`) is given; everything else is the launcher's own command line.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    try:
        from .cli.commands import command
        from .cli.commands import main as _main
    except ModuleNotFoundError as e:  # an interpreter that lacks click: one line, as `python -m launcher` says it
        if (e.name or "launcher").partition(".")[0] == "launcher":
            raise
        from .cli.deps import before_cli

        sys.stderr.write(f"launcher.launch: error: {before_cli(e.name)}\n")
        sys.exit(2)
    command.context_settings["default_map"] = {"append_local_rank": True}
    _main(argv, prog_name="launcher.launch")


if __name__ == "__main__":
    main(sys.argv[1:])
