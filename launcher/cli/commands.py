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
from ..errors import EXIT_USAGE, ConfigError
from . import deps

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


NODES, RDZV, RUN, LOGS, SIG = "Workers and nodes", "Rendezvous", "What to run", "Logs", "Signals and restarts"


@click.command(
    cls=GroupedCommand,
    context_settings={
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
    epilog=EXAMPLES,
)
@flag("nproc-per-node", group=NODES, metavar="N|cpu|gpu|xpu|auto", help="Workers on this node.")
@flag("nnodes", group=NODES, metavar="N|MIN:MAX", help="Nodes in the job.")
@flag("node-rank", group=NODES, metavar="R", help="This node's rank (static rendezvous).")
@flag("master-addr", group=NODES, metavar="HOST", help="Address of node rank 0 (static).")
@flag(
    "master-port",
    group=NODES,
    metavar="PORT",
    help="Port on node rank 0 (static; default 29500, free port on one node).",
)
@flag("local-addr", group=NODES, metavar="HOST", help="This node's address as the others reach it.")
@flag(
    "gpus",
    group=NODES,
    metavar="IDS",
    help="Physical GPUs for this node's workers, e.g. 2,3 (local rank 0 gets GPU 2).",
)
@flag(
    "virtual-local-rank",
    group=NODES,
    is_flag=True,
    help="LOCAL_RANK=0 and one GPU per worker via CUDA_VISIBLE_DEVICES.",
)
@flag(
    "rdzv-backend",
    group=RDZV,
    metavar="NAME",
    help="static (default), c10d, etcd (etcd-v2: the same), or a torchrun.handlers entry point.",
)
@flag("rdzv-endpoint", group=RDZV, metavar="HOST:PORT", help="Where the rendezvous store is.")
@flag("rdzv-id", group=RDZV, metavar="ID", help="Job id shared by all nodes (TORCHELASTIC_RUN_ID).")
@flag("rdzv-conf", group=RDZV, metavar="K=V,...", help="Backend settings, e.g. join_timeout=600.")
@flag("standalone", group=RDZV, is_flag=True, help="One node, no store to set up (the default for one node).")
@flag("module", "-m", group=RUN, is_flag=True, help="Run the script as `python -m MODULE`.")
@flag("no-python", group=RUN, is_flag=True, help="Run the script as a command, without python.")
@flag(
    "run-path",
    group=RUN,
    is_flag=True,
    help="As torchrun: a fresh interpreter runs the script (wins over --no_python and -m).",
)
@click.option(
    "--preload/--no-preload",
    " /--no_preload",
    "preload",
    cls=GroupedOption,
    group=RUN,
    default=cfg.DEFAULTS["preload"],
    envvar="PET_PRELOAD",
    show_envvar=False,
    help="Fork workers from an interpreter that imported torch once (warm start and restarts).",
)
@flag(
    "preload-modules",
    group=RUN,
    metavar="MODS",
    help="More modules for --preload to import, e.g. transformers,mypkg.model (implies --preload).",
)
@flag(
    "worker-exit",
    group=RUN,
    metavar="MODE",
    help="quick (default): a spawned Python worker runs python's exit steps, then skips the interpreter's "
    "finalisation (torch's teardown race); finalize: exit as plain `python -u SCRIPT` (docs/preload.md).",
)
@flag("role", group=RUN, metavar="NAME", help="Role name (ROLE_NAME).")
@flag(
    "append-local-rank",
    group=RUN,
    is_flag=True,
    help="Pass --local-rank=N to the script, as torch.distributed.launch did.",
)
@flag(
    "append-local-rank-as",
    group=RUN,
    metavar="FLAG",
    help="Same, with another spelling, e.g. --local_rank.",
)
@flag("use-env", group=RUN, is_flag=True, help="With `python -m launcher.launch`: do not append --local-rank.")
@flag("start-method", group=RUN, metavar="NAME", help="Accepted for torchrun; moot for scripts.")
@flag("max-restarts", group=SIG, metavar="N", help="Restarts of the worker group before giving up.")
@flag(
    "monitor-interval",
    group=SIG,
    metavar="SEC",
    help="Upper bound between periodic checks (exits are seen at once).",
)
@flag("shutdown-timeout", group=SIG, metavar="SEC", help="Grace between SIGTERM and SIGKILL (default 30).")
@flag(
    "hang-timeout",
    group=SIG,
    metavar="SEC",
    help="A worker with no output and no launcher.progress() call for SEC is hung: "
    "its stacks are dumped, the group restarts.",
)
@flag(
    "hang-startup-timeout",
    group=SIG,
    metavar="SEC",
    help="With --hang_timeout: how long a worker may be silent before its first line or progress() call "
    "(imports, data set-up, init_process_group); default 300, or --hang_timeout if longer.",
)
@flag(
    "straggler-threshold",
    group=SIG,
    metavar="FRACTION",
    help="Flag a rank whose launcher.progress(step=) rate stays below this fraction of the job's median (0: off).",
)
@flag("straggler-period", group=SIG, metavar="SEC", help="How long a rank must stay below it to be flagged.")
@flag(
    "restart-policy",
    group=SIG,
    metavar="K=V,...",
    help="Restart backoff and when restarting stops: quick, backoff, backoff_max, no_progress (docs/policy.md).",
)
@flag(
    "recovery",
    group=SIG,
    metavar="MODE",
    help="restart (default): a failed worker restarts the group; in-place: it is replaced alone, the others "
    "keep running (the script uses launcher.worker.inplace; docs/in-place.md).",
)
@flag("in-place-timeout", group=SIG, metavar="SEC", help="An in-place recovery not done in SEC restarts the group.")
@flag(
    "quarantine",
    group=SIG,
    metavar="K=V,...",
    help="Keep a node out whose workers failed in AFTER of its last WINDOW rounds: after=3,window=5,cooldown=3600.",
)
@flag(
    "health-check",
    group=SIG,
    metavar="CMD",
    help="Run before this node joins each round; non-zero keeps it out (exit 69). GPU checks too, with NVML.",
)
@flag("health-check-timeout", group=SIG, metavar="SEC", help="How long --health_check may run (default 60).")
@flag(
    "signals-to-handle",
    group=SIG,
    metavar="SIGS",
    help="Signals that stop the job (forwarded first).",
)
@flag(
    "passthrough-signals",
    group=SIG,
    metavar="SIGS",
    help="Signals forwarded to workers that go on, e.g. SIGUSR1.",
)
@flag("log-dir", group=LOGS, metavar="DIR", help="Per-attempt, per-rank stdout/stderr/error files.")
@flag(
    "redirects",
    "-r",
    group=LOGS,
    metavar="0-3|MAP",
    help="Streams sent to files only: 1 out, 2 err, 3 both; or 0:1,1:3.",
)
@flag("tee", "-t", group=LOGS, metavar="0-3|MAP", help="Streams sent to files and the console.")
@flag(
    "local-ranks-filter",
    group=LOGS,
    metavar="RANKS",
    help="Local ranks shown on the console (all still go to files).",
)
@flag(
    "events-file",
    group=LOGS,
    metavar="PATH",
    help="JSON-lines log of rounds, spawns, exits, restarts, signals.",
)
@flag(
    "metrics-port",
    group=LOGS,
    metavar="PORT",
    help="Serve Prometheus metrics (round, restarts, workers, steps, goodput) on PORT.",
)
@flag(
    "metrics-host",
    group=LOGS,
    metavar="HOST",
    help="Address for --metrics_port (default loopback only; 0.0.0.0 for a scraper on another host).",
)
@click.option(
    "--live/--no-live",
    " /--no_live",
    "live",
    cls=GroupedOption,
    group=LOGS,
    default=cfg.DEFAULTS["live"],
    envvar="PET_LIVE",
    show_envvar=False,
    help="The live worker table (default: on when stderr is a terminal).",
)
@flag("quiet", "-q", group=LOGS, is_flag=True, help="Only worker output, errors and the failure summary.")
@flag(
    "log-level",
    group=LOGS,
    envvar="LAUNCHER_LOG_LEVEL",
    metavar="LEVEL",
    help="The launcher's own messages: debug (also what it recovers from), info, warning or error.",
)
@flag(
    "duplicate-stdout-filters",
    group=LOGS,
    metavar="TEXT,...",
    help="Tee'd stdout lines holding one of these also go to attempt_N/filtered_stdout.log (,, for a comma).",
)
@flag("duplicate-stderr-filters", group=LOGS, metavar="TEXT,...", help="The same for stderr.")
@flag(
    "logs-specs",
    group=LOGS,
    metavar="NAME",
    help="A torchrun.logs_specs entry point that places the log files (default: ours, torch's layout).",
)
@flag(
    "event-log-handler",
    group=LOGS,
    metavar="NAME",
    help="null (default), or console: each launcher event also as a line (--events_file for JSON).",
)
@flag(
    "numa-binding",
    group=NODES,
    metavar="MODE",
    help="Run each worker on the CPUs near its GPU: node, socket, exclusive or core-complex.",
)
@click.version_option(__version__, "--version", prog_name="launcher", message="%(prog)s %(version)s")
@click.argument("training_script", required=False, default="")
@click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED)
def command(**flags) -> None:
    """Start N workers per node with torch's environment, supervise them, restart on failure.

    A drop-in for torchrun: replace `torchrun` with `python -m launcher`. Every option
    also takes its dashed spelling (--nproc-per-node) and a PET_<NAME> environment default.
    """
    config = cfg.from_flags(**flags)
    if flags.get("no_python") and not flags.get("run_path"):
        check_command(flags["training_script"])
    needed = deps.NEEDED + (() if flags.get("no_python") else deps.WORKERS_NEED)
    absent = deps.missing(needed + (deps.METRICS_NEED if config.metrics else ()))
    if absent:  # every one at once
        raise ConfigError(deps.problem(absent))
    try:
        from .run import run  # the machinery loads only once the flags are good

        code = run(config)
    except KeyboardInterrupt:
        # Ctrl-C before the supervisor takes the signals over (it says what it stopped after that): one
        # line, not click's empty one. Nothing is left behind: the guard process stops marked workers.
        sys.stderr.write("launcher: got SIGINT; stopped\n")
        code = 130
    sys.exit(code)


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
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())  # one line, whatever a flag held
        sys.stderr.write(f"{prog_name}: error: {text}\n")
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)  # --help and --version land here
