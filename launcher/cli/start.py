"""`python -m launcher` and the `launcher` command: a plain launch line goes to the job without click.

`main` reads the common line with `flags.quick` and hands anything else to click (`commands.main`):
help, subcommands, abbreviations, environment defaults, errors. `launch` is what the launch command
does with its flags, whoever read them: build the config, check the dependencies, run the job.
"""

from __future__ import annotations

import errno
import os
import sys

from .. import config as cfg
from ..errors import EXIT_USAGE, ConfigError
from . import deps
from .flags import quick

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import NoReturn

PROG = "launcher"


def main(argv: list[str] | None = None) -> None:
    """Entry point: the job for a plain launch line, click for every other; exits with the launcher's code."""
    args = list(sys.argv[1:] if argv is None else argv)
    flags = quick(args, os.environ) if not deps.missing(("click",)) else None
    if flags is None:
        try:
            from .commands import main as click_main
        except ModuleNotFoundError as e:  # an interpreter that lacks click: one line, as for the others
            if (e.name or "launcher").partition(".")[0] == "launcher":
                raise
            usage_error(PROG, deps.before_cli(e.name))
        click_main(args, prog_name=PROG)
        return
    try:
        code = launch(**flags)  # type: ignore[arg-type]
    except ConfigError as e:
        usage_error(PROG, str(e))
    # What click's main does with these (the same line read by click ends the same way)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        sys.exit(130)
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        sys.exit(1)
    leave(code)


def leave(code: int) -> NoReturn:
    """The job is over: exit with `code` as python would, less the interpreter's finalisation, whose
    teardown of the agent's ~300 modules kept the launch going 15-30 ms more (agent/quick_exit.py)."""
    from ..agent.quick_exit import leave as leave_now

    try:  # stdout left unflushed is reported, status 120, as the interpreter's finalisation reports it
        sys.stdout.flush()
    except (OSError, ValueError) as e:
        sys.stderr.write(f"Exception ignored in: {sys.stdout!r}\n{type(e).__name__}: {e}\n")
        code = 120
    leave_now(code, free_main=False)  # (the agent's __main__ holds nothing to free)


def launch(**flags) -> int:
    """Run the job the launch command's flags describe; the launcher's exit code. Bad flags: ConfigError."""
    config = cfg.from_flags(**flags)  # type: ignore[arg-type]
    if flags.get("no_python") and not flags.get("run_path"):
        check_command(str(flags["training_script"]))
    needed = deps.NEEDED + (() if flags.get("no_python") else deps.WORKERS_NEED)
    absent = deps.missing(needed + (deps.METRICS_NEED if config.metrics else ()))
    if absent:  # every one at once
        raise ConfigError(deps.problem(absent))
    try:
        from .run import run  # the machinery loads only once the flags are good

        return run(config)
    except KeyboardInterrupt:
        # Ctrl-C before the supervisor takes the signals over (it says what it stopped after that): one
        # line, not click's empty one. Nothing is left behind: the guard process stops marked workers.
        sys.stderr.write("launcher: got SIGINT; stopped\n")
        return 130


def check_command(command: str) -> None:
    """--no_python: the command must exist and be executable, found the way the workers' exec finds it."""
    import shutil

    if shutil.which(command, path=os.environ.get("PATH", os.defpath)):
        return
    if "/" not in command:
        hint = f"; for a file here, write ./{command}" if os.path.isfile(command) else ""
        raise ConfigError(f"--no_python command {command!r} is not on PATH{hint}")
    if not os.path.exists(command):
        raise ConfigError(f"--no_python command {command!r} does not exist")
    if os.path.isdir(command):
        raise ConfigError(f"--no_python command {command!r} is a folder, not a program")
    raise ConfigError(f"--no_python command {command!r} is not executable (chmod +x {command})")


def usage_error(prog: str, text: str) -> NoReturn:
    """Bad input: `PROG: error: TEXT` as one printable line on stderr, exit 2."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())  # one line, whatever a flag held
    sys.stderr.write(f"{prog}: error: {text}\n")
    sys.exit(EXIT_USAGE)
