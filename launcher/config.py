"""The frozen launch configuration and the pure parsers that build it.

Nothing here imports click: `cli.py` turns flags into keyword arguments and calls
`from_flags()`, which validates every value and raises `ConfigError` with a one-line
message that names the fix.
"""

from __future__ import annotations

import enum
import os
import re
import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import ConfigError
from .numa import NumaMode, parse_numa_binding
from .parsers import parse_port, parse_seconds
from .policy import RestartPolicy, parse_policy
from .rendezvous import BACKENDS, Flags, JobParams, Settings
from .rendezvous.settings import LocalSettings

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
# Backends named only so their error can say why not.
LATER_BACKENDS = ("etcd-v2",)
JOIN_TOKEN_ENV = "LAUNCHER_JOIN_TOKEN"  # the optional shared secret a node needs to join a job
QUARANTINE_FILE_ENV = "LAUNCHER_QUARANTINE_FILE"  # where a quarantined node appends its name (Slurm scripts)
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3


@dataclass(frozen=True)
class Std:
    """Which of stdout/stderr go somewhere, per local rank (torchrun's `-r`/`-t` syntax)."""

    default: int = STD_NONE
    per_rank: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def for_rank(self, local_rank: int) -> int:
        return self.per_rank.get(local_rank, self.default)

    def has(self, local_rank: int, stream: str) -> bool:
        """True if `stream` ("stdout"/"stderr") of `local_rank` is selected."""
        bit = STD_OUT if stream == "stdout" else STD_ERR
        return bool(self.for_rank(local_rank) & bit)


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
    straggler_threshold: float = 0.5  # a rank below this fraction of the job's median step rate ...
    straggler_period: float = 60.0  # ... for this long is flagged (0: off)
    preload_modules: tuple[str, ...] | None = None  # None: spawn every worker; else fork them from a zygote
    numa_binding: NumaMode | None = None  # bind each worker to the CPUs near its GPU (see numa)
    module: bool = False  # the program is `-m MODULE`, not a script path
    metrics: tuple[str, int] | None = None  # --metrics_host, --metrics_port: a Prometheus endpoint (None: none)
    restart_policy: RestartPolicy = RestartPolicy()  # --restart_policy and --quarantine (docs/policy.md)
    health_check: str | None = None  # --health_check CMD: run before each round this node joins
    health_check_timeout: float = 60.0
    quarantine_file: str | None = None  # $LAUNCHER_QUARANTINE_FILE: a quarantined node appends its name

    @property
    def run_id(self) -> str:
        return self.rdzv_id

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

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


# ---------------------------------------------------------------------------- parsers


def parse_nnodes(text: str) -> tuple[int, int]:
    """`"2"` → (2, 2); `"1:4"` → (1, 4); requires 0 < MIN <= MAX."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) == 1:
            lo = hi = int(parts[0])
        elif len(parts) == 2:
            lo, hi = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--nnodes {text!r} is not N or MIN:MAX (e.g. --nnodes 2 or --nnodes 1:4)") from None
    if lo < 1 or hi < lo:
        raise ConfigError(f"--nnodes {text!r} needs 0 < MIN <= MAX (e.g. --nnodes 1:4)")
    return lo, hi


def count_gpus(environ: Mapping[str, str] = os.environ) -> int:
    """GPUs visible to workers, from CUDA_VISIBLE_DEVICES or the NVIDIA driver; no torch import."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid id ("-1" hides every device).
        n = 0
        for v in ids:
            if v.strip().startswith("-"):
                break
            n += 1
        return n
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def parse_nproc(text: str, environ: Mapping[str, str] = os.environ) -> int:
    """An int, or `cpu`, `gpu`, `auto` (GPU count where there are GPUs, else CPU count)."""
    value = str(text).strip().lower()
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        gpus = count_gpus(environ)
        if gpus:
            return gpus
        if value == "gpu":
            raise ConfigError("--nproc_per_node gpu: no GPU found; pass a number, cpu or auto")
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(
            f"--nproc_per_node {text!r} is not a number, cpu, gpu or auto (e.g. --nproc_per_node 4)"
        ) from None
    if n < 1:
        raise ConfigError(f"--nproc_per_node {text!r} must be at least 1")
    return n


def parse_kv(text: str, flag: str = "--rdzv_conf") -> dict[str, str]:
    """`"a=1,b=2"` → {"a": "1", "b": "2"} (torchrun syntax: no escaping of commas)."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} item {item!r} is not key=value (e.g. {flag} join_timeout=60)")
        out[key.strip()] = value.strip()
    return out


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


def parse_std(text: str, flag: str) -> Std:
    """torchrun's redirect syntax: `0`-`3`, or a per-local-rank map `0:1,12:3` (ranks >= 10 allowed)."""
    text = str(text).strip() or "0"
    if re.fullmatch(r"[0-3]", text):
        return Std(int(text))
    if not re.fullmatch(r"\d+:[0-3](,\d+:[0-3])*", text):
        raise ConfigError(f"{flag} {text!r} is not 0-3 or a map like 0:1,1:3 (1 stdout, 2 stderr, 3 both)")
    per_rank = {int(k): int(v) for k, v in (p.split(":") for p in text.split(","))}
    return Std(STD_NONE, MappingProxyType(per_rank))


def parse_ranks(text: str | None, flag: str = "--local_ranks_filter") -> frozenset[int] | None:
    if text is None or not str(text).strip():
        return None
    try:
        ranks = frozenset(int(p) for p in str(text).split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a list of ranks (e.g. {flag} 0,1)") from None
    if any(r < 0 for r in ranks):
        raise ConfigError(f"{flag} {text!r} has a negative rank")
    return ranks


def parse_gpus(text: str | None) -> tuple[str, ...]:
    """`--gpus 2,3` → ("2", "3"): physical ids (or GPU UUIDs), unique."""
    if text is None or not str(text).strip():
        return ()
    ids = tuple(p.strip() for p in str(text).split(","))
    if any(not i or not re.fullmatch(r"\d+|(GPU|MIG)-[\w-]+", i) for i in ids):
        raise ConfigError(f"--gpus {text!r} is not a list of GPU ids (e.g. --gpus 2,3)")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--gpus {text!r} names a GPU twice")
    return ids


def parse_signals(text: str, flag: str = "--signals_to_handle") -> tuple[int, ...]:
    """`"SIGTERM,USR1,10"` → signal numbers."""
    out = []
    for name in filter(None, (s.strip() for s in str(text).split(","))):
        try:
            sig = (
                signal.Signals(int(name))
                if name.isdigit()
                else signal.Signals[name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()]
            )
        except (KeyError, ValueError):
            raise ConfigError(f"{flag}: {name!r} is not a signal name (e.g. SIGTERM,SIGUSR1)") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise ConfigError(f"{flag}: {sig.name} cannot be handled; leave it out")
        out.append(int(sig))
    return tuple(dict.fromkeys(out))


# ---------------------------------------------------------------------------- building


# Flags torchrun has that the launcher parses but does not honour (yet): a clear error, never ignored.
UNSUPPORTED = {
    "logs_specs": "--logs_specs is not supported; use --log_dir, --redirects and --tee",
    "duplicate_stdout_filters": "--duplicate_stdout_filters is not supported yet; grep the per-rank logs in --log_dir",
    "duplicate_stderr_filters": "--duplicate_stderr_filters is not supported yet; grep the per-rank logs in --log_dir",
    "event_log_handler": "--event_log_handler only takes null; other handlers are not supported",
}
START_METHODS = ("spawn", "fork", "forkserver")


def _reject_unsupported(values: Mapping[str, object]) -> None:
    for name, value in values.items():
        if name == "start_method":
            if value not in START_METHODS:
                raise ConfigError(f"--start_method {value!r} is not one of {', '.join(START_METHODS)}")
        elif name not in UNSUPPORTED:
            raise ConfigError(f"--{name} is not a launcher option")
        elif value not in (None, (), "", "null"):
            raise ConfigError(UNSUPPORTED[name])


def _program(script: str, module: bool, no_python: bool, run_path: bool) -> tuple[str, ...]:
    if not script:
        raise ConfigError("missing the training script (e.g. launcher --nproc_per_node 2 train.py)")
    if module and no_python:
        raise ConfigError("-m and --no_python cannot be combined; pick one")
    if no_python:
        return (script,)
    python = os.environ.get("PYTHON_EXEC") or _sys_executable()
    if module:
        return (python, "-u", "-m", script)
    if not os.path.exists(script):
        raise ConfigError(f"training script {script!r} does not exist (use -m for a module, --no_python for a command)")
    del run_path  # runs the script in a fresh interpreter, which is what runpy.run_path would do
    return (python, "-u", script)


def parse_preload(preload: bool, modules: str | None) -> tuple[str, ...] | None:
    """`--preload` and `--preload_modules a,b.c` → the user's extra modules (None: no preload)."""
    names = tuple(m.strip() for m in (modules or "").split(",") if m.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise ConfigError(
                f"--preload_modules {name!r} is not a module name (e.g. --preload_modules transformers,mypkg.model)"
            )
    return names if preload or names else None


def _sys_executable() -> str:
    import sys

    return sys.executable


LOG_LEVELS = ("debug", "info", "warning", "error")


def parse_log_level(text: str | None) -> str:
    level = str(text or "info").strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log_level {text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def parse_fraction(value: float | str, flag: str) -> float:
    """A number from 0 to 1 (0: off)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a number") from None
    if not 0 <= x < 1:
        raise ConfigError(f"{flag} {value!r} must be from 0 (off) to below 1, a fraction of the job's median")
    return x


def parse_whole(value: int | str, flag: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a whole number") from None


def _rendezvous(name: str, rdzv_id: str, standalone: bool, flags: Flags) -> tuple[str, str, Settings]:
    """The backend (`local` when one node needs no store), the run id, and the backend's settings."""
    backend = name.strip().lower()
    run_id = "" if rdzv_id == "none" else rdzv_id
    if standalone or (
        backend == "static" and not flags.endpoint and flags.master_port is None and flags.max_nodes == 1
    ):
        # The embedded default: one node, no store to meet at, a free port picked per round.
        if standalone and flags.max_nodes > 1:
            raise ConfigError("--standalone is for one node; drop it or use --nnodes 1")
        backend, run_id = "local", run_id or str(uuid.uuid4())
    elif backend in LATER_BACKENDS:
        raise ConfigError(
            f"--rdzv_backend {backend} is not supported: etcd's v2 API is off since etcd 3.4 and gone in 3.6; use --rdzv_backend etcd (v3 API)"
        )
    elif backend not in BACKENDS or backend == "local":
        raise ConfigError(f"--rdzv_backend {name!r} is unknown; use static, c10d or etcd")
    return backend, run_id or "none", BACKENDS[backend].parse(flags)


def from_flags(
    *,
    training_script: str,
    training_script_args: tuple[str, ...] = (),
    nnodes: str = "1:1",
    nproc_per_node: str | None = None,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_id: str = "none",
    rdzv_conf: str = "",
    standalone: bool = False,
    max_restarts: int | str = 0,
    monitor_interval: float | str = 0.1,
    role: str = "default",
    module: bool = False,
    no_python: bool = False,
    run_path: bool = False,
    log_dir: str | None = None,
    redirects: str = "0",
    tee: str = "0",
    local_ranks_filter: str | None = None,
    node_rank: int | str = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | str | None = None,
    local_addr: str | None = None,
    signals_to_handle: str = DEFAULT_SIGNALS,
    passthrough_signals: str = "",
    shutdown_timeout: float | str | None = None,
    virtual_local_rank: bool = False,
    append_local_rank: bool = False,
    append_local_rank_as: str | None = None,
    use_env: bool = False,
    gpus: str | None = None,
    events_file: str | None = None,
    live: bool | None = None,
    quiet: bool = False,
    log_level: str | None = "info",
    hang_timeout: float | str | None = None,
    straggler_threshold: float | str = 0.5,
    straggler_period: float | str = 60.0,
    preload: bool = False,
    preload_modules: str | None = None,
    numa_binding: str | None = None,
    metrics_port: int | str | None = None,
    metrics_host: str = "127.0.0.1",
    restart_policy: str = "",
    quarantine: str = "",
    health_check: str | None = None,
    health_check_timeout: float | str = 60.0,
    environ: Mapping[str, str] = os.environ,
    **later: object,
) -> LaunchConfig:
    """Validate torchrun-style flags and build the frozen config (raises `ConfigError`)."""
    _reject_unsupported(later)  # start_method is valid but moot: scripts always run as processes

    min_nodes, max_nodes = parse_nnodes(nnodes)
    gpu_ids = parse_gpus(gpus)
    if nproc_per_node is None:
        nproc_per_node = str(len(gpu_ids)) if gpu_ids else "1"
    nproc = parse_nproc(nproc_per_node, environ)
    if gpu_ids and nproc > len(gpu_ids):
        raise ConfigError(
            f"--nproc_per_node {nproc} asks for more workers than --gpus gives ({len(gpu_ids)}); give more GPUs or fewer workers"
        )
    restarts = parse_whole(max_restarts, "--max_restarts")
    if restarts < 0:
        raise ConfigError(f"--max_restarts {max_restarts!r} must be 0 or more")
    rank = parse_whole(node_rank, "--node_rank")
    conf = parse_kv(rdzv_conf)
    token = read_join_token(conf, environ)
    signals = parse_signals(signals_to_handle)
    passthrough = parse_signals(passthrough_signals, "--passthrough_signals")
    if set(signals) & set(passthrough):
        both = ",".join(signal.Signals(s).name for s in sorted(set(signals) & set(passthrough)))
        raise ConfigError(f"{both} is in both --signals_to_handle and --passthrough_signals; pick one")
    if shutdown_timeout is None:
        shutdown_timeout = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    grace = parse_seconds(shutdown_timeout, "--shutdown_timeout")
    interval = parse_seconds(monitor_interval, "--monitor_interval", minimum=0.001)
    port = parse_port(master_port) if master_port not in (None, "") else None
    if not master_addr or not str(master_addr).strip():
        raise ConfigError("--master_addr is empty; give the address of node rank 0")
    program = _program(training_script, module, no_python, run_path)
    flags = Flags(
        endpoint=rdzv_endpoint,
        conf=conf,
        environ=environ,
        nnodes=nnodes,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=rank,
        master_addr=str(master_addr).strip().strip("[]"),
        master_port=port,
        local_addr=local_addr or None,
    )
    backend, run_id, settings = _rendezvous(str(rdzv_backend), str(rdzv_id), standalone, flags)

    local_rank_arg = None
    if (append_local_rank or append_local_rank_as) and not use_env:
        local_rank_arg = str(append_local_rank_as or "--local-rank")
        if not re.fullmatch(r"--?[A-Za-z][\w-]*", local_rank_arg):
            raise ConfigError(f"--append_local_rank_as {local_rank_arg!r} is not a flag name (e.g. --local_rank)")

    return LaunchConfig(
        program=program,
        nproc_per_node=nproc,
        script_args=tuple(training_script_args),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        rdzv_backend=backend,
        rdzv_id=run_id,
        rendezvous=settings,
        local_addr=local_addr or None,
        max_restarts=restarts,
        monitor_interval=interval,
        role=role,
        log_dir=log_dir or None,
        redirects=parse_std(redirects, "--redirects"),
        tee=parse_std(tee, "--tee"),
        local_ranks_filter=parse_ranks(local_ranks_filter),
        signals_to_handle=signals,
        passthrough_signals=passthrough,
        shutdown_timeout=grace,
        virtual_local_rank=virtual_local_rank,
        local_rank_arg=local_rank_arg,
        join_token=token if backend in ("c10d", "etcd") else None,
        gpus=gpu_ids,
        events_file=events_file or None,
        live=live,
        quiet=quiet,
        log_level=parse_log_level(log_level),
        hang_timeout=parse_seconds(hang_timeout, "--hang_timeout", minimum=0.1)
        if hang_timeout not in (None, "")
        else None,
        straggler_threshold=parse_fraction(straggler_threshold, "--straggler_threshold"),
        straggler_period=parse_seconds(straggler_period, "--straggler_period", minimum=1.0),
        preload_modules=parse_preload(preload, preload_modules) if not no_python else None,
        numa_binding=parse_numa_binding(numa_binding),
        module=module,
        metrics=parse_metrics(metrics_host, metrics_port),
        restart_policy=parse_policy(parse_kv(restart_policy, "--restart_policy"), parse_kv(quarantine, "--quarantine")),
        health_check=(health_check or "").strip() or None,
        health_check_timeout=parse_seconds(health_check_timeout, "--health_check_timeout", minimum=0.1),
        quarantine_file=environ.get(QUARANTINE_FILE_ENV) or None,
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
            f"launcher status reads a c10d or etcd rendezvous, not {rdzv_backend!r}; give --rdzv_backend as on the job's nodes"
        )
    if not rdzv_id or rdzv_id == "none":
        raise ConfigError("launcher status needs --rdzv_id, the job's id")
    conf = parse_kv(rdzv_conf)
    token = read_join_token(conf, environ)
    settings = BACKENDS[backend].parse(Flags(endpoint=rdzv_endpoint, conf=conf, environ=environ))
    every = parse_seconds(watch, "--watch", minimum=0.5) if watch not in (None, "") else None
    return StatusConfig(backend, rdzv_id, settings, token, StatusFormat.JSON if json else StatusFormat.TABLE, every)
