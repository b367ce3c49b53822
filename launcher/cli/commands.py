"""The command line: click turns flags into one frozen `LaunchConfig`; nothing else happens here.

Every torchrun 2.13 flag works in both spellings (`--nproc_per_node`, `--nproc-per-node`) and
from `PET_<NAME>` environment variables, as with torchrun. Errors are one line and exit 2.
"""

from __future__ import annotations

import os
import sys

import click

from .. import __version__, slurm
from .. import config as cfg
from ..errors import ConfigError
from .flags import LAUNCH, RDZV
from .start import launch, usage_error

EXAMPLES = """\b
Examples:
  one node, 4 workers:
    python -m launcher --nproc_per_node 4 train.py --lr 0.1
  two nodes (run on each, NODE=0 or 1):
    python -m launcher --nnodes 2 --node_rank $NODE --master_addr node0 \\
        --master_port 29500 --nproc_per_node 8 train.py
  Slurm (one task per node; nodes, rank and master come from the step):
    srun --ntasks-per-node=1 python -m launcher --nproc_per_node 8 train.py
  a module, or any command:
    python -m launcher --nproc_per_node 2 -m mypkg.train
    python -m launcher --nproc_per_node 2 --no_python ./run.sh
"""


class GroupedOption(click.Option):
    """An option that knows which help section it belongs to."""

    def __init__(self, *args, group: str = "Other", **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        """Show one spelling (`--a_b`, torchrun's habit); both are accepted."""
        full = self.opts
        self.opts = [
            o
            for o in full
            if not (
                o.startswith("--")
                and "-" in o[2:]
                and o.replace("-", "_")[2:] != o[2:]
                and o[:2] + o[2:].replace("-", "_") in full
            )
        ]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = full


class GroupedCommand(click.Command):
    """Help that lists options by section, in the order they were declared."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            if not isinstance(param, click.Option):
                continue
            record = param.get_help_record(ctx)
            if record:
                sections.setdefault(getattr(param, "group", "Other"), []).append(record)
        for name, rows in sections.items():
            with formatter.section(name):
                formatter.write_dl(rows)
        with formatter.section("Subcommands"):  # each has its own --help
            formatter.write_dl(SUBCOMMAND_HELP)


def flag(name: str, *names: str, group: str, env: bool = True, **kwargs):
    """Declare `--a-b` with its `--a_b` twin (plus short `names`), its PET_ variable (or `envvar`), its
    default (from `config.DEFAULTS`) and its help group."""
    dest = name.replace("-", "_")
    spellings = list(names) + [f"--{name}"] + ([f"--{dest}"] if dest != name else [])
    envvar = kwargs.pop("envvar", f"PET_{dest.upper()}" if env else None)
    if dest in cfg.DEFAULTS and "default" not in kwargs:  # the one table of defaults
        kwargs["default"] = cfg.DEFAULTS[dest]
    return click.option(*spellings, dest, cls=GroupedOption, group=group, envvar=envvar, show_envvar=False, **kwargs)


def launch_options(command):
    """Declare every option of `flags.LAUNCH` on `command`, in the table's order (the order of --help)."""
    for f in reversed(LAUNCH):
        if f.switch:  # `--preload/--no-preload`, and `--no_preload` too
            option = click.option(
                f"--{f.name}/--no-{f.name}",
                f" /--no_{f.dest}",
                f.dest,
                cls=GroupedOption,
                group=f.group,
                default=cfg.DEFAULTS[f.dest],
                envvar=f.envvar,
                show_envvar=False,
                help=f.help,
            )
        else:
            extra = {"is_flag": True} if f.is_flag else {"metavar": f.metavar}
            option = flag(f.name, *f.short, group=f.group, envvar=f.envvar, help=f.help, **extra)
        command = option(command)
    return command


@click.command(
    cls=GroupedCommand,
    context_settings={
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
    epilog=EXAMPLES,
)
@launch_options
@click.version_option(__version__, "--version", prog_name="launcher", message="%(prog)s %(version)s")
@click.argument("training_script", required=False, default="")
@click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED)
def command(**flags) -> None:
    """Start N workers per node with torch's environment, supervise them, restart on failure.

    A drop-in for torchrun: replace `torchrun` with `python -m launcher`. Every option
    also takes its dashed spelling (--nproc-per-node) and a PET_<NAME> environment default.
    """
    sys.exit(launch(**flags))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to bind (only this one).")
@click.option("--port", default=29400, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
def store(host: str, port: int) -> None:
    """Serve a c10d rendezvous store on its own, so no training node has to host it."""
    from ..rendezvous.c10d import store_main

    try:
        sys.exit(store_main(host, port, lambda bound: click.echo(f"launcher store: serving on {host}:{bound}")))
    except OSError as e:
        raise click.UsageError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@flag("rdzv-backend", group=RDZV, default="c10d", metavar="NAME", help="c10d or etcd, as on the job's nodes.")
@flag("rdzv-endpoint", group=RDZV, default="", metavar="HOST:PORT", help="Where the rendezvous store is.")
@flag("rdzv-id", group=RDZV, default="none", metavar="ID", help="The job's id.")
@flag(
    "rdzv-conf",
    group=RDZV,
    default="",
    metavar="K=V,...",
    help="As on the nodes: TLS, credentials, join_token_file=PATH.",
)
@click.option("--json", "json_out", is_flag=True, help="One JSON object (per refresh), for scripts.")
@click.option(
    "--watch",
    "watch",
    default=None,
    metavar="SEC",
    is_flag=False,
    flag_value="2",
    help="Refresh every SEC seconds (2 when given alone) until Ctrl-C.",
)
def status(
    rdzv_backend: str, rdzv_endpoint: str, rdzv_id: str, rdzv_conf: str, json_out: bool, watch: str | None
) -> None:
    """Show a running, failed or forming job from its rendezvous store: round, restarts of the budget,
    nodes (state, heartbeat age), ranks (pid, state, restarts, last progress, step rate). Read-only."""
    config = cfg.status_from_flags(
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        rdzv_conf=rdzv_conf,
        json=json_out,
        watch=watch,
    )
    from .status import StatusUnreachable, status_main

    if config.format is cfg.StatusFormat.JSON:
        import json

        def show(job: dict) -> None:
            click.echo(json.dumps(job))
    else:
        from .view import show_status as show  # type: ignore[assignment]
    try:
        sys.exit(status_main(config, show))
    except StatusUnreachable as e:
        sys.stderr.write(f"launcher status: error: {e}\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(0)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True), metavar="EVENTS_FILE|DIR...")
@click.option("-o", "--output", default="launcher-report.html", show_default=True, help="The HTML file to write.")
def report(paths: tuple[str, ...], output: str) -> None:
    """One self-contained HTML page from the nodes' --events_file files (or the folders that hold
    them): a timeline per node, the goodput breakdown and the job's verdict."""
    from .report import report_main

    try:
        click.echo(report_main(list(paths), output))
    except OSError as e:
        raise ConfigError(f"{e.filename}: {e.strerror}") from None
    except ValueError as e:
        raise ConfigError(str(e)) from None


SUBCOMMANDS = {"store": store, "status": status, "report": report}

# Subcommands that are launches of a worker-side module (imported by workers only, never here;
# config.TOOL_MODULES lists them: no goodput line):
#   launcher check [launcher flags] [-- args]  ==  launcher [launcher flags] -m launcher.worker.preflight [args]
WORKLOADS = {("check",): "launcher.worker.preflight", ("bench", "allreduce"): "launcher.worker.allreduce"}


SUBCOMMAND_HELP = [
    ("check", "Pre-flight check of the job's ranks and fabric."),
    ("bench allreduce", "all_reduce bus bandwidth, as nccl-tests reports it."),
    ("store", "A c10d rendezvous store on its own, off the training nodes."),
    ("status", "A running, failed or forming job, read from its rendezvous store."),
    ("report", "An HTML page of a job from its events files: timeline, goodput, verdict."),
]


def bench_help() -> None:
    """`launcher bench --help`: the benchmarks there are."""
    click.echo("Usage: launcher bench NAME [launcher flags] [-- benchmark args]\n\nBenchmarks:")
    for name, text in SUBCOMMAND_HELP:
        if name.startswith("bench "):
            click.echo(f"  {name[6:]:<12}{text}")
    click.echo("\nEach has its own help: launcher bench NAME --help")
    sys.exit(0)


def workload(args: list[str]) -> tuple[str, list[str]]:
    """`check ...` or `bench allreduce ...` -> (its name, the arguments of the normal launch)."""
    if args[0] == "bench" and args[1:2] in (["-h"], ["--help"]):
        bench_help()
    words = next((w for w in WORKLOADS if tuple(args[: len(w)]) == w), None)
    if words is None:
        raise click.UsageError("the benchmark there is: bench allreduce" + (f" (not {args[1]!r})" if args[1:] else ""))
    rest, module = args[len(words) :], WORKLOADS[words]
    flags, extra = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    if {"-h", "--help"} & set(flags):  # the module's own options; its import does not import torch
        import importlib

        click.echo(importlib.import_module(module).parser().format_help())
        click.echo(f"Runs `launcher [launcher flags] -m {module} [args]`; launcher flags: `launcher --help`.")
        sys.exit(0)
    return " ".join(words), [*flags, "-m", module, *extra]


def expand_prefixes(cmd: click.Command, args: list[str]) -> list[str]:
    """`--nproc_per 2` -> `--nproc_per_node 2`: an unambiguous prefix of a long option, as torchrun's
    argparse accepts, in either spelling; only before the script (what follows is the script's).
    An ambiguous or unknown option is left alone, for click's error and its suggestion."""
    # The context must carry the command's settings: click (>= 8.2) keeps the help option the first
    # context made, and a bare one's is `--help` alone (`-h` was then refused: issue 34)
    ctx = click.Context(cmd, **cmd.context_settings)
    params = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option)]
    names = {o: (p, o in p.secondary_opts) for p in params for o in p.opts + p.secondary_opts}
    out, i = list(args), 0
    while i < len(out) and out[i].startswith("-") and out[i] not in ("-", "--"):
        name, eq, _ = out[i].partition("=")
        if name.startswith("--") and name not in names:
            key = name[2:].replace("-", "_")
            found = {
                (id(p), sec): o
                for o, (p, sec) in names.items()
                if o.startswith("--") and o[2:].replace("-", "_").startswith(key)
            }
            if len(found) == 1:
                name = next(iter(found.values()))
                out[i] = name + out[i][len(out[i].partition("=")[0]) :]
        param = names.get(name if name.startswith("--") else name[:2])
        attached = eq or (not name.startswith("--") and len(name) > 2)
        i += 2 if param and not param[0].is_flag and not attached else 1
    return out


def closest_first(typed: str, options: list[str]) -> list[str]:
    """click's suggestions for a mistyped option, most alike first (click lists them alphabetically:
    `--nproc_pre_node` got `--no_preload` first), one spelling each, the one the user typed in."""
    import difflib

    dashed = "-" in typed[2:] and "_" not in typed
    by_name: dict[str, str] = {}
    for o in options:
        key = o.replace("_", "-")
        if key not in by_name or (("-" in o[2:] and "_" not in o) == dashed):
            by_name[key] = o
    norm = typed.replace("-", "_")

    def alike(o: str) -> tuple[bool, float]:  # an option the typed text begins comes first (an ambiguous prefix)
        o = o.replace("-", "_")
        return o.startswith(norm), difflib.SequenceMatcher(None, norm, o).ratio()

    return sorted(by_name.values(), key=alike, reverse=True)


def main(argv: list[str] | None = None, prog_name: str = "launcher") -> None:
    """Entry point: run the command, turning any usage error into one line and exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = command
    if args and args[0] in SUBCOMMANDS:
        cmd, prog_name = SUBCOMMANDS[args[0]], f"{prog_name} {args[0]}"
        args = args[1:]
    try:
        if cmd is command and args and args[0] in ("check", "bench"):
            name, args = workload(args)
            prog_name = f"{prog_name} {name}"
        if cmd is command:
            args = expand_prefixes(cmd, args)
        extra = {}
        if cmd is command and slurm.in_step(os.environ):  # precedence: flag > PET_* > Slurm > default
            extra["default_map"] = {**(cmd.context_settings.get("default_map") or {}), **slurm.defaults(os.environ)}
        code = cmd.main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
    except (click.ClickException, ConfigError) as e:
        text = e.format_message() if isinstance(e, click.ClickException) else str(e)
        if isinstance(e, click.NoSuchOption) and e.possibilities:
            best, *others = closest_first(e.option_name, e.possibilities)
            text = f"{e.message.rstrip('.')}. Did you mean {best}?" + (f" (or {', '.join(others)})" if others else "")
        usage_error(prog_name, text)
    except click.exceptions.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)  # --help and --version land here
