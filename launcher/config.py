"""The frozen launch configuration, the one table of flag defaults, and `from_flags`, which builds it.

Nothing here imports click: `cli.py` declares each flag with its default from `DEFAULTS`, turns the
command line into keyword arguments and calls `from_flags()`, which parses every value once (the
parsers are in `parsers.py`) and raises `ConfigError` with a one-line message that names the fix.
What is accepted but worth a word (an unknown `--rdzv_conf` key, a torchrun switch mapped onto
ours) becomes one line in `LaunchConfig.notes`, which the composition root logs.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from . import plugins
from .errors import ConfigError
from .parsers import (
    parse_endpoint,
    parse_filters,
    parse_flag,
    parse_fraction,
    parse_gpus,
    parse_kv,
    parse_log_level,
    parse_nnodes,
    parse_nproc,
    parse_numa_binding,
    parse_policy,
    parse_port,
    parse_preload,
    parse_ranks,
    parse_recovery,
    parse_seconds,
    parse_signals,
    parse_std,
    parse_whole,
    parse_worker_exit,
)
from .rendezvous import BACKENDS, Flags, JobParams
from .rendezvous.settings import C10D_PORT, ETCD_KEYS, RDZV_KEYS, LocalSettings
from .spec import NumaMode, RecoveryMode, RestartPolicy, Std, WorkerExit

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from .rendezvous import Settings

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
JOIN_TOKEN_ENV = "LAUNCHER_JOIN_TOKEN"  # the optional shared secret a node needs to join a job
QUARANTINE_FILE_ENV = "LAUNCHER_QUARANTINE_FILE"  # where a quarantined node appends its name (Slurm scripts)

# Every launch flag's default, as the command line would spell it: `cli.py` declares the flags with
# these, and `from_flags` fills in what a caller leaves out from here. One place per default.
DEFAULTS: Mapping[str, object] = MappingProxyType(
    {
        # workers and nodes
        "nproc_per_node": None,  # --gpus' count, else 1
        "nnodes": "1:1",
        "node_rank": "0",
        "master_addr": "127.0.0.1",
        "master_port": None,  # 29500 (static), a free port on one node
        "local_addr": None,
        "gpus": None,
        "virtual_local_rank": False,
        "numa_binding": None,
        # rendezvous
        "rdzv_backend": "static",
        "rdzv_endpoint": "",
        "rdzv_id": "none",
        "rdzv_conf": "",
        "standalone": False,
        # what to run
        "module": False,
        "no_python": False,
        "run_path": False,
        "preload": False,
        "preload_modules": None,
        "worker_exit": "quick",  # docs/preload.md, "A worker's exit"
        "role": "default",
        "append_local_rank": False,
        "append_local_rank_as": None,
        "use_env": False,
        "start_method": "spawn",
        # signals and restarts
        "max_restarts": "0",
        "monitor_interval": "0.1",
        "shutdown_timeout": None,  # TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30
        "hang_timeout": None,
        "hang_startup_timeout": "300",
        "straggler_threshold": "0.5",
        "straggler_period": "60",
        "signals_to_handle": DEFAULT_SIGNALS,
        "passthrough_signals": "",
        "restart_policy": "",  # docs/policy.md
        "recovery": "restart",  # docs/in-place.md
        "in_place_timeout": "60",
        "quarantine": "",
        "health_check": None,
        "health_check_timeout": "60",
        # logs
        "log_dir": None,
        "redirects": "0",
        "tee": "0",
        "local_ranks_filter": None,
        "events_file": None,
        "live": None,  # on when stderr is a terminal
        "quiet": False,
        "log_level": "info",
        "duplicate_stdout_filters": None,
        "duplicate_stderr_filters": None,
        "logs_specs": None,
        "event_log_handler": "null",
        # observing
        "metrics_port": None,  # docs/goodput.md
        "metrics_host": "127.0.0.1",  # loopback: the metrics name the job, its hosts and failures, unauthenticated
    }
)
START_METHODS = ("spawn", "fork", "forkserver")
# What `launcher check` and `launcher bench allreduce` run (cli.WORKLOADS): tools, not training, so
# runs a spawned worker's script, then exits it quickly; a file of the standard library only, so that any
# interpreter runs it (PYTHON_EXEC need not have the launcher installed)
QUICK_EXIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent", "worker_exit.py")
# no goodput line: a pre-flight check or a benchmark has no useful work to measure
TOOL_MODULES = frozenset({"launcher.worker.preflight", "launcher.worker.allreduce"})
EVENT_LOG_HANDLERS = ("null", "console", "dynamic_rendezvous")


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one launcher run needs, validated; built once by `from_flags`."""

    program: tuple[str, ...]  # interpreter, flags and script (or the --no_python command)
    nproc_per_node: int
    script_args: tuple[str, ...] = ()
    min_nodes: int = 1
    max_nodes: int = 1
    rdzv_backend: str = "local"
    rdzv_id: str = ""
    rendezvous: Settings = LocalSettings()  # the backend's own settings, parsed from --rdzv_endpoint/--rdzv_conf
    local_addr: str | None = None
    max_restarts: int = 0
    monitor_interval: float = 0.1
    role: str = "default"
    log_dir: str | None = None
    redirects: Std = Std()
    tee: Std = Std()
    local_ranks_filter: frozenset[int] | None = None
    signals_to_handle: tuple[int, ...] = ()
    passthrough_signals: tuple[int, ...] = ()
    shutdown_timeout: float = 30.0
    virtual_local_rank: bool = False
    local_rank_arg: str | None = None  # e.g. "--local-rank": appended as torch.distributed.launch did
    join_token: str | None = field(default=None, repr=False)
    gpus: tuple[str, ...] = ()  # physical GPU ids; local rank i uses gpus[i]
    events_file: str | None = None
    live: bool | None = None  # None: the live table when stderr is a terminal
    quiet: bool = False
    log_level: str = "info"  # the launcher's own messages: debug, info, warning or error
    hang_timeout: float | None = None  # opt-in: a worker silent this long is hung
    hang_startup_timeout: float = 300.0  # ... or this long (if longer) before its first line or progress() call
    straggler_threshold: float = 0.5  # a rank below this fraction of the job's median step rate ...
    straggler_period: float = 60.0  # ... for this long is flagged (0: off)
    preload_modules: tuple[str, ...] | None = None  # None: spawn every worker; else fork them from a zygote
    numa_binding: NumaMode | None = None  # bind each worker to the CPUs near its GPU (see numa)
    module: bool = False  # the program is `-m MODULE`, not a script path
    metrics: tuple[str, int] | None = None  # --metrics_host, --metrics_port: a Prometheus endpoint (None: none)
    stdout_filters: tuple[str, ...] = ()  # tee'd stdout lines holding one go to attempt_N/filtered_stdout.log too
    stderr_filters: tuple[str, ...] = ()  # the same for stderr
    logs_specs: str | None = None  # a `torchrun.logs_specs` entry point that places the log files (None: ours)
    events_on_console: bool = False  # --event_log_handler console: each event also as a launcher line
    notes: tuple[str, ...] = ()  # what the flags made worth one line at start (logged by the composition root)
    restart_policy: RestartPolicy = RestartPolicy()  # --restart_policy and --quarantine (docs/policy.md)
    health_check: str | None = None  # --health_check CMD: run before each round this node joins
    health_check_timeout: float = 60.0
    quarantine_file: str | None = None  # $LAUNCHER_QUARANTINE_FILE: a quarantined node appends its name
    recovery: RecoveryMode = RecoveryMode.RESTART  # --recovery: in-place replaces a failed worker alone
    in_place_timeout: float = 60.0  # an in-place recovery not done in this long falls back to a restart
    worker_exit: WorkerExit = WorkerExit.QUICK  # a spawned Python worker's exit: no finalisation (quick)

    @property
    def run_id(self) -> str:
        return self.rdzv_id

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def trains(self) -> bool:
        """A training job, not one of the launcher's own tools (`launcher check`, `launcher bench`)."""
        return not (self.module and self.program[-1] in TOOL_MODULES)

    @property
    def job(self) -> JobParams:
        """What every rendezvous backend gets beside its own settings."""
        return JobParams(
            self.run_id,
            self.nproc_per_node,
            self.min_nodes,
            self.max_nodes,
            self.max_restarts,
            self.local_addr,
            self.join_token,
        )


# ---------------------------------------------------------------------------- building


def read_join_token(conf: dict[str, str], environ: Mapping[str, str]) -> str | None:
    """The job's join token from `--rdzv_conf join_token_file=PATH` (taken out of `conf`) or the environment."""
    if "join_token" in conf:
        raise ConfigError(f"--rdzv_conf join_token= would show in ps; set {JOIN_TOKEN_ENV} or use join_token_file=PATH")
    path = conf.pop("join_token_file", None)
    if path is None:
        return environ.get(JOIN_TOKEN_ENV) or None
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(f"--rdzv_conf join_token_file={path}: {e.strerror}") from None
    if not token:
        raise ConfigError(f"--rdzv_conf join_token_file={path} is empty")
    return token


def _program(script: str, module: bool, no_python: bool, exit_mode: WorkerExit) -> tuple[str, ...]:
    if not script:
        raise ConfigError("missing the training script (e.g. launcher --nproc_per_node 2 train.py)")
    if module and no_python:
        raise ConfigError("-m and --no_python cannot be combined; pick one")
    if no_python:
        return (script,)
    python = os.environ.get("PYTHON_EXEC") or _sys_executable()
    # quick: the script runs as under `python -u`, and its exit skips the interpreter's finalisation
    # (torch's teardown race); the zygote forks from the same prefix (program[-1] is the target)
    interp = (python, "-u", QUICK_EXIT) if exit_mode is WorkerExit.QUICK else (python, "-u")
    if module:
        return (*interp, "-m", script)
    if not os.path.exists(script):
        raise ConfigError(f"training script {script!r} does not exist (use -m for a module, --no_python for a command)")
    # --run_path: a fresh interpreter runs the script, which is what runpy.run_path in a spawned worker does
    return (*interp, script)


def _sys_executable() -> str:
    import sys

    return sys.executable


# `--rdzv_conf` keys each backend honours; any other key is a note, never an error (torchrun ignores them).
CONF_KEYS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "local": frozenset({"timeout"}),
        "static": frozenset({"timeout"}),
        "c10d": frozenset(RDZV_KEYS),
        # is_host and password: etcd's parser says why not (no node hosts etcd; ps would show a password)
        "etcd": frozenset(ETCD_KEYS) | frozenset(RDZV_KEYS) | {"password"},
    }
)
# torch's etcd-v2 spelling of the TLS keys -> ours
ETCD_V2_KEYS = MappingProxyType({"ssl_cert": "cert", "ssl_cert_key": "key", "ca_cert": "cacert"})


def _known_conf(backend: str, conf: dict[str, str], notes: list[str]) -> dict[str, str]:
    """`conf` less the keys `backend` does not know, each named in one note (with a near known key, if any)."""
    known = CONF_KEYS.get(backend)
    if known is None:  # a torchrun.handlers backend reads its own keys
        return conf
    kept = {}
    for key, value in conf.items():
        if key in known:
            kept[key] = value
            continue
        import difflib  # only for a key that needs a suggestion

        # only a near key (difflib's 0.6): `foo` got "did you mean join_timeout?", which was noise
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        # the key only: an unknown key may hold a secret, and notes go to logs
        notes.append(f"--rdzv_conf {key} is not a {backend} rendezvous setting; ignored{hint}")
    return kept


def _rendezvous(name: str, rdzv_id: str, standalone: bool, flags: Flags, notes: list[str]) -> tuple[str, str, Settings]:
    """The backend (`local` when one node needs no store), the run id, and the backend's settings."""
    backend = name.strip().lower()
    run_id = "" if rdzv_id == "none" else rdzv_id
    conf = dict(flags.conf)
    if standalone or (
        backend == "static" and not flags.endpoint and flags.master_port is None and flags.max_nodes == 1
    ):
        # The embedded default: one node, no store to meet at, a free port picked per round.
        if standalone and flags.max_nodes > 1:
            raise ConfigError("--standalone is for one node; drop it or use --nnodes 1")
        backend, run_id = "local", run_id or _uuid4()
    elif backend == "etcd-v2":
        # torch's etcd-v2 needs etcd's v2 API (off since etcd 3.4, gone in 3.6); ours speaks v3.
        notes.append(
            "--rdzv_backend etcd-v2 runs on the launcher's etcd backend (etcd's v3 API, which etcd 3.6 keeps); "
            "every node of the job must run the launcher"
        )
        backend = "etcd"
        conf = {ETCD_V2_KEYS.get(k, k): v for k, v in conf.items()}
    elif backend not in BACKENDS or backend in ("local", "torch"):
        if plugins.find("torchrun.handlers", backend) is None:
            raise ConfigError(
                f"--rdzv_backend {name!r} is unknown; use static, c10d or etcd, or install the package that "
                "registers it on the torchrun.handlers entry point"
            )
        from .rendezvous.torch_adapter import IDENTICAL_VAR, TorchHandlerSettings

        identical = flags.environ.get(IDENTICAL_VAR) == "1"
        settings = TorchHandlerSettings(backend, flags.endpoint, tuple(conf.items()), flags.local_addr, identical)
        return "torch", run_id or "none", settings
    flags = dataclasses.replace(flags, conf=_known_conf(backend, conf, notes))
    return backend, run_id or "none", BACKENDS[backend].parse(flags)


def _uuid4() -> str:
    """`str(uuid.uuid4())`, a random id: uuid's import (and platform's with it) cost a launch's start ~3 ms."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40  # version 4
    b[8] = b[8] & 0x3F | 0x80  # RFC 4122's variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _free_port_store(backend: str, endpoint: str) -> bool:
    """`--rdzv_backend c10d --rdzv_endpoint HOST:0`: torchrun hosts the store on an ephemeral port."""
    if backend.strip().lower() != "c10d" or not str(endpoint).strip():
        return False
    return parse_endpoint(endpoint, C10D_PORT)[1] == 0


def _logs_specs(name: str | None) -> str | None:
    """`--logs_specs default` is the launcher's own layout (torch's DefaultLogsSpecs' layout); another name
    must be on the `torchrun.logs_specs` entry point (found now, loaded when the job starts)."""
    if name is None or str(name).strip() in ("", "default"):
        return None
    if plugins.find("torchrun.logs_specs", str(name).strip()) is None:
        raise ConfigError(
            f"--logs_specs {name!r}: no torchrun.logs_specs entry point has that name; "
            "install the package that registers it, or drop the flag"
        )
    return str(name).strip()


# torchrun's environment switches: what each does here, said once at start where it is set.
ENV_NOTES = {
    "TORCHELASTIC_HEALTH_CHECK_PORT": "ignored: torch's open-source agent serves nothing on it either "
    "(its HealthCheckServer is a stub); watch the job with `launcher status` or --events_file",
    "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": "not acted on: a worker stuck in D state is not restarted for "
    "it here; --hang_timeout SEC restarts a worker that makes no progress",
}


def _env_notes(environ: Mapping[str, str]) -> list[str]:
    return [f"{name}={environ[name]}: {text}" for name, text in ENV_NOTES.items() if _positive(environ.get(name))]


def _positive(value: str | None) -> bool:
    """Set to something that switches it on (torch: a non-positive or unparsable timeout disables it)."""
    try:
        return float(value or 0) > 0
    except ValueError:
        return bool(value)


def from_flags(
    *,
    training_script: str,
    training_script_args: tuple[str, ...] = (),
    environ: Mapping[str, str] = os.environ,
    **given: object,
) -> LaunchConfig:
    """Validate torchrun-style flags (any left out take their `DEFAULTS`) and build the frozen config."""
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"--{unknown[0]} is not a launcher option")
    f = {**DEFAULTS, **given}
    notes = _env_notes(environ)
    start_method = str(f["start_method"]).strip()
    if start_method not in START_METHODS:  # valid but moot: scripts always run as processes
        raise ConfigError(f"--start_method {start_method!r} is not one of {', '.join(START_METHODS)}")
    event_handler = str(f["event_log_handler"] or "null").strip().lower()
    if event_handler not in EVENT_LOG_HANDLERS:
        raise ConfigError(f"--event_log_handler {event_handler!r} is not one of {', '.join(EVENT_LOG_HANDLERS)}")
    if event_handler == "dynamic_rendezvous":
        notes.append(
            "--event_log_handler dynamic_rendezvous: torch's rendezvous events have no equivalent here; "
            "--events_file PATH records the launcher's"
        )
    module = parse_flag(f["module"], "PET_MODULE")
    no_python = parse_flag(f["no_python"], "PET_NO_PYTHON")
    run_path = parse_flag(f["run_path"], "PET_RUN_PATH")
    standalone = parse_flag(f["standalone"], "PET_STANDALONE")
    if run_path:
        no_python = module = False  # torchrun: --run_path wins over --no_python and -m

    min_nodes, max_nodes = parse_nnodes(f["nnodes"])
    gpu_ids = parse_gpus(f["gpus"])
    nproc_text = f["nproc_per_node"]
    if nproc_text is None:
        nproc_text = str(len(gpu_ids)) if gpu_ids else "1"
    nproc = parse_nproc(nproc_text, environ)
    if gpu_ids and nproc > len(gpu_ids):
        raise ConfigError(
            f"--nproc_per_node {nproc} asks for more workers than --gpus gives ({len(gpu_ids)}); "
            "give more GPUs or fewer workers"
        )
    restarts = parse_whole(f["max_restarts"], "--max_restarts")
    if restarts < 0:
        raise ConfigError(f"--max_restarts {f['max_restarts']!r} must be 0 or more")
    rank = parse_whole(f["node_rank"], "--node_rank")
    conf = parse_kv(f["rdzv_conf"])
    token = read_join_token(conf, environ)
    signals = parse_signals(f["signals_to_handle"])
    passthrough = parse_signals(f["passthrough_signals"], "--passthrough_signals")
    if set(signals) & set(passthrough):
        both = ",".join(signal.Signals(s).name for s in sorted(set(signals) & set(passthrough)))
        raise ConfigError(f"{both} is in both --signals_to_handle and --passthrough_signals; pick one")
    shutdown_timeout = f["shutdown_timeout"]
    if shutdown_timeout is None:
        shutdown_timeout = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    grace = parse_seconds(shutdown_timeout, "--shutdown_timeout")
    interval = parse_seconds(f["monitor_interval"], "--monitor_interval", minimum=0.001)
    master_port = f["master_port"]
    port = parse_port(master_port) if master_port not in (None, "") else None
    master_addr = f["master_addr"]
    if not master_addr or not str(master_addr).strip():
        raise ConfigError("--master_addr is empty; give the address of node rank 0")
    worker_exit = parse_worker_exit(f["worker_exit"])
    program = _program(training_script, module, no_python, worker_exit)
    if _free_port_store(str(f["rdzv_backend"]), f["rdzv_endpoint"]):
        if min_nodes > 1:
            raise ConfigError(
                f"--rdzv_endpoint {f['rdzv_endpoint']} puts the store on a free port no other node can find; "
                "give a fixed port (e.g. :29400)"
            )
        notes.append(
            f"--rdzv_endpoint {f['rdzv_endpoint']}: a store on a free port no other node can find, so one node, "
            "as --standalone (which torchrun spells c10d on localhost:0)"
        )
        standalone, max_nodes, conf = True, 1, {}
    local_addr = f["local_addr"] or None
    flags = Flags(
        endpoint=f["rdzv_endpoint"],
        conf=conf,
        environ=environ,
        nnodes=f["nnodes"],
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=rank,
        master_addr=str(master_addr).strip().strip("[]"),
        master_port=port,
        local_addr=local_addr,
    )
    backend, run_id, settings = _rendezvous(str(f["rdzv_backend"]), str(f["rdzv_id"]), standalone, flags, notes)

    local_rank_arg = None
    append_as = f["append_local_rank_as"]
    if (parse_flag(f["append_local_rank"], "PET_APPEND_LOCAL_RANK") or append_as) and not parse_flag(
        f["use_env"], "PET_USE_ENV"
    ):
        local_rank_arg = str(append_as or "--local-rank")
        if not re.fullmatch(r"--?[A-Za-z][\w-]*", local_rank_arg):
            raise ConfigError(f"--append_local_rank_as {local_rank_arg!r} is not a flag name (e.g. --local_rank)")
    hang_timeout = f["hang_timeout"]
    preload = parse_preload(parse_flag(f["preload"], "PET_PRELOAD"), f["preload_modules"])

    return LaunchConfig(
        program=program,
        nproc_per_node=nproc,
        script_args=tuple(training_script_args),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        rdzv_backend=backend,
        rdzv_id=run_id,
        rendezvous=settings,
        local_addr=local_addr,
        max_restarts=restarts,
        monitor_interval=interval,
        role=str(f["role"]),
        log_dir=f["log_dir"] or None,
        redirects=parse_std(f["redirects"], "--redirects"),
        tee=parse_std(f["tee"], "--tee"),
        local_ranks_filter=parse_ranks(f["local_ranks_filter"]),
        signals_to_handle=signals,
        passthrough_signals=passthrough,
        shutdown_timeout=grace,
        virtual_local_rank=parse_flag(f["virtual_local_rank"], "PET_VIRTUAL_LOCAL_RANK"),
        local_rank_arg=local_rank_arg,
        join_token=token if backend in ("c10d", "etcd") else None,
        gpus=gpu_ids,
        events_file=f["events_file"] or None,
        live=f["live"],
        quiet=parse_flag(f["quiet"], "PET_QUIET"),
        log_level=parse_log_level(f["log_level"]),
        hang_timeout=parse_seconds(hang_timeout, "--hang_timeout", minimum=0.1)
        if hang_timeout not in (None, "")
        else None,
        hang_startup_timeout=parse_seconds(f["hang_startup_timeout"], "--hang_startup_timeout", minimum=0.1),
        straggler_threshold=parse_fraction(f["straggler_threshold"], "--straggler_threshold"),
        straggler_period=parse_seconds(f["straggler_period"], "--straggler_period", minimum=1.0),
        preload_modules=preload if not no_python else None,
        numa_binding=parse_numa_binding(f["numa_binding"]),
        module=module,
        metrics=parse_metrics(f["metrics_host"], f["metrics_port"]),
        stdout_filters=parse_filters(f["duplicate_stdout_filters"]),
        stderr_filters=parse_filters(f["duplicate_stderr_filters"]),
        logs_specs=_logs_specs(f["logs_specs"]),
        events_on_console=event_handler == "console",
        notes=tuple(notes),
        restart_policy=parse_policy(
            parse_kv(f["restart_policy"], "--restart_policy"), parse_kv(f["quarantine"], "--quarantine")
        ),
        health_check=(f["health_check"] or "").strip() or None,
        health_check_timeout=parse_seconds(f["health_check_timeout"], "--health_check_timeout", minimum=0.1),
        quarantine_file=environ.get(QUARANTINE_FILE_ENV) or None,
        worker_exit=worker_exit,
        recovery=parse_recovery(f["recovery"], max_nodes, environ),
        in_place_timeout=parse_seconds(f["in_place_timeout"], "--in_place_timeout", minimum=1.0),
    )


def parse_metrics(host: str | None, port: int | str | None) -> tuple[str, int] | None:
    """`--metrics_port PORT` (0: any free port, said at start) on `--metrics_host` (loopback by default)."""
    if port in (None, ""):
        return None
    host = str(host or "").strip().strip("[]")
    if not host or any(c.isspace() for c in host):
        raise ConfigError(
            f"--metrics_host {host!r} is not an address (e.g. --metrics_host 0.0.0.0 for every interface)"
        )
    return host, parse_port(port, "--metrics_port")


# ---------------------------------------------------------------------------- launcher status


class StatusFormat(enum.Enum):
    """How `launcher status` shows the job."""

    TABLE = "table"  # a rich table (plain text off a terminal)
    JSON = "json"  # one JSON object per read, for scripts


@dataclass(frozen=True)
class StatusConfig:
    """`launcher status`: which job, in which store, with which credentials, shown how."""

    rdzv_backend: str
    rdzv_id: str
    rendezvous: Settings
    join_token: str | None = field(default=None, repr=False)
    format: StatusFormat = StatusFormat.TABLE
    watch: float | None = None  # refresh every this many seconds; None: read once


def status_from_flags(
    *,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_id: str,
    rdzv_conf: str = "",
    json: bool = False,
    watch: float | str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> StatusConfig:
    """Validate `launcher status` flags: the rendezvous flags of the job, as on its nodes."""
    backend = str(rdzv_backend).strip().lower()
    if backend not in ("c10d", "etcd"):
        raise ConfigError(
            f"launcher status reads a c10d or etcd rendezvous, not {rdzv_backend!r}; "
            "give --rdzv_backend as on the job's nodes"
        )
    if not rdzv_id or rdzv_id == "none":
        raise ConfigError("launcher status needs --rdzv_id, the job's id")
    conf = parse_kv(rdzv_conf)
    token = read_join_token(conf, environ)
    settings = BACKENDS[backend].parse(Flags(endpoint=rdzv_endpoint, conf=conf, environ=environ))
    every = parse_seconds(watch, "--watch", minimum=0.5) if watch not in (None, "") else None
    return StatusConfig(backend, rdzv_id, settings, token, StatusFormat.JSON if json else StatusFormat.TABLE, every)
