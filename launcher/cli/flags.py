"""The launch command's options as data, and a plain reading of the common command line without click.

`LAUNCH` is the one list of the launch command's options (after the two arguments, the script and
its arguments): `commands` declares each to click from it, in this order (the order of `--help`),
and `quick` reads a plain launch line with it. Importing click and building its command cost more
than everything else the agent does before its first worker starts (~50 ms of ~0.1 s), so
`python -m launcher` reads the common line here (`quick`) and leaves anything else to click:
help, version, subcommands, abbreviations, short options glued to a value, a PET_ variable, a
Slurm step, and every error. Nothing here imports click.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .. import slurm
from ..config import DEFAULTS

NODES, RDZV, RUN, LOGS, SIG = "Workers and nodes", "Rendezvous", "What to run", "Logs", "Signals and restarts"
# `launcher WORD ...` for these words is a subcommand, not a script (commands.SUBCOMMANDS and WORKLOADS)
SUBCOMMAND_WORDS = frozenset({"store", "status", "report", "check", "bench"})


class Flag:
    """One launch option: `--a-b`, its `--a_b` twin and `short` spellings, with its help group and text.

    `switch`: an on/off pair (`--preload/--no-preload`, plus `--no_preload`); `is_flag`: no value.
    Its default is `config.DEFAULTS[dest]`; its environment default is `envvar` (else `PET_<DEST>`).
    """

    __slots__ = ("name", "dest", "short", "group", "help", "metavar", "is_flag", "switch", "envvar")

    def __init__(
        self,
        name: str,
        *short: str,
        group: str,
        help: str,
        metavar: str | None = None,
        is_flag: bool = False,
        switch: bool = False,
        envvar: str | None = None,
    ):
        self.name, self.dest, self.short = name, name.replace("-", "_"), short
        self.group, self.help, self.metavar = group, help, metavar
        self.is_flag, self.switch = is_flag, switch
        self.envvar = envvar or f"PET_{self.dest.upper()}"

    def spellings(self) -> dict[str, bool]:
        """Every spelling of this option -> the value it stands for (True: given; a switch's off spellings: False)."""
        on = [*self.short, f"--{self.name}", f"--{self.dest}"]
        off = [f"--no-{self.name}", f"--no_{self.dest}"] if self.switch else []
        return {**dict.fromkeys(on, True), **dict.fromkeys(off, False)}


LAUNCH: tuple[Flag, ...] = (
    Flag("nproc-per-node", group=NODES, metavar="N|cpu|gpu|xpu|auto", help="Workers on this node."),
    Flag("nnodes", group=NODES, metavar="N|MIN:MAX", help="Nodes in the job."),
    Flag("node-rank", group=NODES, metavar="R", help="This node's rank (static rendezvous)."),
    Flag("master-addr", group=NODES, metavar="HOST", help="Address of node rank 0 (static)."),
    Flag(
        "master-port",
        group=NODES,
        metavar="PORT",
        help="Port on node rank 0 (static; default 29500, free port on one node).",
    ),
    Flag("local-addr", group=NODES, metavar="HOST", help="This node's address as the others reach it."),
    Flag(
        "gpus",
        group=NODES,
        metavar="IDS",
        help="Physical GPUs for this node's workers, e.g. 2,3 (local rank 0 gets GPU 2).",
    ),
    Flag(
        "virtual-local-rank",
        group=NODES,
        is_flag=True,
        help="LOCAL_RANK=0 and one GPU per worker via CUDA_VISIBLE_DEVICES.",
    ),
    Flag(
        "rdzv-backend",
        group=RDZV,
        metavar="NAME",
        help="static (default), c10d, etcd (etcd-v2: the same), or a torchrun.handlers entry point.",
    ),
    Flag("rdzv-endpoint", group=RDZV, metavar="HOST:PORT", help="Where the rendezvous store is."),
    Flag("rdzv-id", group=RDZV, metavar="ID", help="Job id shared by all nodes (TORCHELASTIC_RUN_ID)."),
    Flag("rdzv-conf", group=RDZV, metavar="K=V,...", help="Backend settings, e.g. join_timeout=600."),
    Flag("standalone", group=RDZV, is_flag=True, help="One node, no store to set up (the default for one node)."),
    Flag("module", "-m", group=RUN, is_flag=True, help="Run the script as `python -m MODULE`."),
    Flag("no-python", group=RUN, is_flag=True, help="Run the script as a command, without python."),
    Flag(
        "run-path",
        group=RUN,
        is_flag=True,
        help="As torchrun: a fresh interpreter runs the script (wins over --no_python and -m).",
    ),
    Flag(
        "preload",
        group=RUN,
        switch=True,
        help="Fork workers from an interpreter that imported torch once (warm start and restarts).",
    ),
    Flag(
        "preload-modules",
        group=RUN,
        metavar="MODS",
        help=(
            "More modules for --preload to import, e.g. transformers,mypkg.model; -NAME drops one it imports "
            "by default, e.g. -torch for a script without torch (implies --preload)."
        ),
    ),
    Flag(
        "worker-exit",
        group=RUN,
        metavar="MODE",
        help="quick (default): a spawned Python worker runs python's exit steps, then skips the interpreter's "
        "finalisation (torch's teardown race); finalize: exit as plain `python -u SCRIPT` (docs/preload.md).",
    ),
    Flag("role", group=RUN, metavar="NAME", help="Role name (ROLE_NAME)."),
    Flag(
        "append-local-rank",
        group=RUN,
        is_flag=True,
        help="Pass --local-rank=N to the script, as torch.distributed.launch did.",
    ),
    Flag("append-local-rank-as", group=RUN, metavar="FLAG", help="Same, with another spelling, e.g. --local_rank."),
    Flag("use-env", group=RUN, is_flag=True, help="With `python -m launcher.launch`: do not append --local-rank."),
    Flag("start-method", group=RUN, metavar="NAME", help="Accepted for torchrun; moot for scripts."),
    Flag("max-restarts", group=SIG, metavar="N", help="Restarts of the worker group before giving up."),
    Flag(
        "monitor-interval",
        group=SIG,
        metavar="SEC",
        help="Upper bound between periodic checks (exits are seen at once).",
    ),
    Flag("shutdown-timeout", group=SIG, metavar="SEC", help="Grace between SIGTERM and SIGKILL (default 30)."),
    Flag(
        "hang-timeout",
        group=SIG,
        metavar="SEC",
        help="A worker with no output and no launcher.progress() call for SEC is hung: "
        "its stacks are dumped, the group restarts.",
    ),
    Flag(
        "hang-startup-timeout",
        group=SIG,
        metavar="SEC",
        help="With --hang_timeout: how long a worker may be silent before its first line or progress() call "
        "(imports, data set-up, init_process_group); default 300, or --hang_timeout if longer.",
    ),
    Flag(
        "straggler-threshold",
        group=SIG,
        metavar="FRACTION",
        help="Flag a rank whose launcher.progress(step=) rate stays below this fraction of the job's median (0: off).",
    ),
    Flag("straggler-period", group=SIG, metavar="SEC", help="How long a rank must stay below it to be flagged."),
    Flag(
        "restart-policy",
        group=SIG,
        metavar="K=V,...",
        help="Restart backoff and when restarting stops: quick, backoff, backoff_max, no_progress (docs/policy.md).",
    ),
    Flag(
        "recovery",
        group=SIG,
        metavar="MODE",
        help="restart (default): a failed worker restarts the group; in-place: it is replaced alone, the others "
        "keep running (the script uses launcher.worker.inplace; docs/in-place.md).",
    ),
    Flag("in-place-timeout", group=SIG, metavar="SEC", help="An in-place recovery not done in SEC restarts the group."),
    Flag(
        "quarantine",
        group=SIG,
        metavar="K=V,...",
        help="Keep a node out whose workers failed in AFTER of its last WINDOW rounds: after=3,window=5,cooldown=3600.",
    ),
    Flag(
        "health-check",
        group=SIG,
        metavar="CMD",
        help="Run before this node joins each round; non-zero keeps it out (exit 69). GPU checks too, with NVML.",
    ),
    Flag("health-check-timeout", group=SIG, metavar="SEC", help="How long --health_check may run (default 60)."),
    Flag("signals-to-handle", group=SIG, metavar="SIGS", help="Signals that stop the job (forwarded first)."),
    Flag(
        "passthrough-signals", group=SIG, metavar="SIGS", help="Signals forwarded to workers that go on, e.g. SIGUSR1."
    ),
    Flag("log-dir", group=LOGS, metavar="DIR", help="Per-attempt, per-rank stdout/stderr/error files."),
    Flag(
        "redirects",
        "-r",
        group=LOGS,
        metavar="0-3|MAP",
        help="Streams sent to files only: 1 out, 2 err, 3 both; or 0:1,1:3.",
    ),
    Flag("tee", "-t", group=LOGS, metavar="0-3|MAP", help="Streams sent to files and the console."),
    Flag(
        "local-ranks-filter",
        group=LOGS,
        metavar="RANKS",
        help="Local ranks shown on the console (all still go to files).",
    ),
    Flag("events-file", group=LOGS, metavar="PATH", help="JSON-lines log of rounds, spawns, exits, restarts, signals."),
    Flag(
        "metrics-port",
        group=LOGS,
        metavar="PORT",
        help="Serve Prometheus metrics (round, restarts, workers, steps, goodput) on PORT.",
    ),
    Flag(
        "metrics-host",
        group=LOGS,
        metavar="HOST",
        help="Address for --metrics_port (default loopback only; 0.0.0.0 for a scraper on another host).",
    ),
    Flag("live", group=LOGS, switch=True, help="The live worker table (default: on when stderr is a terminal)."),
    Flag("quiet", "-q", group=LOGS, is_flag=True, help="Only worker output, errors and the failure summary."),
    Flag(
        "log-level",
        group=LOGS,
        envvar="LAUNCHER_LOG_LEVEL",
        metavar="LEVEL",
        help="The launcher's own messages: debug (also what it recovers from), info, warning or error.",
    ),
    Flag(
        "duplicate-stdout-filters",
        group=LOGS,
        metavar="TEXT,...",
        help="Tee'd stdout lines holding one of these also go to attempt_N/filtered_stdout.log (,, for a comma).",
    ),
    Flag("duplicate-stderr-filters", group=LOGS, metavar="TEXT,...", help="The same for stderr."),
    Flag(
        "logs-specs",
        group=LOGS,
        metavar="NAME",
        help="A torchrun.logs_specs entry point that places the log files (default: ours, torch's layout).",
    ),
    Flag(
        "event-log-handler",
        group=LOGS,
        metavar="NAME",
        help="null (default), or console: each launcher event also as a line (--events_file for JSON).",
    ),
    Flag(
        "numa-binding",
        group=NODES,
        metavar="MODE",
        help="Run each worker on the CPUs near its GPU: node, socket, exclusive or core-complex.",
    ),
)

# spelling -> (its option, the value it stands for); value options map to True and take the next word
_SPELLINGS: Mapping[str, tuple[Flag, bool]] = {s: (f, v) for f in LAUNCH for s, v in f.spellings().items()}


def quick(args: Sequence[str], environ: Mapping[str, str]) -> dict[str, object] | None:
    """The keyword arguments click would hand the launch command for `args`, read without click; None
    for a line that click must read (the module's docstring says which).

    What this reads: exact spellings only (`--nproc_per_node 8`, `--nproc-per-node=8`, `-m`), each value
    the next word unless it looks like an option, up to the first word that is no option: the
    script, followed by its own arguments, as click reads them (`allow_interspersed_args` off).
    """
    if not args or args[0] in SUBCOMMAND_WORDS or slurm.in_step(environ):
        return None
    if any(f.envvar in environ for f in LAUNCH):  # click reads and converts them; a plain reading might differ
        return None
    flags: dict[str, object] = {f.dest: DEFAULTS[f.dest] for f in LAUNCH}
    i = 0
    while i < len(args):
        word = args[i]
        if word == "-":  # `-` as the script: click's to read
            return None
        if not word.startswith("-"):
            flags["training_script"], flags["training_script_args"] = word, tuple(args[i + 1 :])
            return flags
        name, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        found = _SPELLINGS.get(name)
        if found is None:  # a prefix, `--`, `-h`, glued short options, a typo: click's to read or refuse
            return None
        flag, value = found
        if flag.is_flag or flag.switch:
            if eq:  # a value given to an option that takes none: click's error
                return None
            flags[flag.dest], i = value, i + 1
        elif eq:
            flags[flag.dest], i = attached, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            flags[flag.dest], i = args[i + 1], i + 2
        else:  # no value, or one that looks like an option
            return None
    return None  # no script: click's error
