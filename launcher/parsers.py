"""Every value parser of the command line (counts, ranks, streams, signals, ports, endpoints, seconds),
shared by `config` and the rendezvous backends' settings; each takes the text as given and returns a
typed value, or raises `ConfigError` with a one-line message that names the fix."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from types import MappingProxyType

from .errors import ConfigError
from .spec import STD_NONE, NumaMode, RecoveryMode, RestartPolicy, Std, WorkerExit


def parse_endpoint(text: str, default_port: int | None, flag: str = "--rdzv_endpoint") -> tuple[str, int]:
    """`host[:port]`, `[v6]:port`; the port must be 0..65535."""
    text = str(text).strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:\[\]\s]+)(?::(\d+))?", text)
    if not m:
        raise ConfigError(f"{flag} {text!r} is not host:port (e.g. {flag} node0:29400)")
    host = m.group(1) or m.group(3)
    port_text = m.group(2) or m.group(4)
    if port_text is None:
        if default_port is None:
            raise ConfigError(f"{flag} {text!r} needs a port (e.g. {host}:29400)")
        return host, default_port
    return host, parse_port(port_text, flag)


def parse_port(text: str | int, flag: str = "--master_port") -> int:
    try:
        port = int(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{flag} {text!r} is not a port number (0-65535)")
    return port


MAX_SECONDS = 1e6  # about 11 days: longer is a typo, and select(), TCPStore and etcd all take it


def parse_seconds(value: float | str | None, flag: str, minimum: float = 0.0) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a number of seconds") from None
    if not seconds >= minimum:  # also rejects NaN
        raise ConfigError(f"{flag} {value!r} must be at least {minimum:g}")
    if not seconds <= MAX_SECONDS:  # inf, 1e400: would overflow a timeout later, mid-job
        raise ConfigError(f"{flag} {value!r} must be at most {MAX_SECONDS:g} seconds")
    return seconds


# ---------------------------------------------------------------------------- counts and lists


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


def count_cpus() -> int:
    """CPUs this process may run on (taskset, cgroups, Slurm's binding), as torch counts them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def count_gpus(environ: Mapping[str, str] = os.environ) -> int:
    """GPUs visible to workers, from CUDA_VISIBLE_DEVICES or the NVIDIA driver; no torch import."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = 0
        for v in (v for v in visible.split(",") if v.strip()):
            # CUDA stops at the first invalid id ("-1" hides every device).
            if v.strip().startswith("-"):
                break
            n += 1
        return n
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def count_xpus() -> int:
    """Intel GPUs as torch counts them (torch.xpu); 0 where this torch has no XPU support or none is there.
    The only count that imports torch: XPUs have no driver file to read, and `xpu` must be named for it."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return xpu.device_count() if xpu is not None and xpu.is_available() else 0


def parse_nproc(text: str, environ: Mapping[str, str] = os.environ) -> int:
    """An int, or `cpu`, `gpu`, `xpu`, `auto` (GPU count where there are GPUs, else CPU count)."""
    value = str(text).strip().lower()
    if value == "cpu":
        return count_cpus()
    if value == "xpu":
        n = count_xpus()
        if not n:
            raise ConfigError("--nproc_per_node xpu: torch sees no XPU here (torch.xpu); pass a number, cpu or auto")
        return n
    if value in ("gpu", "auto"):
        gpus = count_gpus(environ)
        if gpus:
            return gpus
        if value == "gpu":
            raise ConfigError("--nproc_per_node gpu: no GPU found; pass a number, cpu or auto")
        return count_cpus()
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(
            f"--nproc_per_node {text!r} is not a number, cpu, gpu, xpu or auto (e.g. --nproc_per_node 4)"
        ) from None
    if n < 1:
        raise ConfigError(f"--nproc_per_node {text!r} must be at least 1")
    return n


def unquote(text: str) -> str:
    """`'a=1,b=2'` → `a=1,b=2`: quotes that reached argv whole (YAML args, subprocess lists) come off."""
    text = str(text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].strip()
    return text


def parse_kv(text: str, flag: str = "--rdzv_conf") -> dict[str, str]:
    """`"a=1,b=2"` → {"a": "1", "b": "2"} (torchrun syntax: no escaping of commas; outer quotes dropped)."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in unquote(text).split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} item {item!r} is not key=value (e.g. {flag} join_timeout=60)")
        out[key.strip()] = unquote(value)
    return out


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
    """`0,1` → the local ranks shown on the console (None: all)."""
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


def parse_filters(text: str | None) -> tuple[str, ...]:
    """torchrun's `--duplicate_std*_filters`: comma-separated substrings, `,,` for a literal comma."""
    if text is None or not str(text):
        return ()
    parts = str(text).replace(",,", "\0").split(",")
    return tuple(p.replace("\0", ",") for p in parts if p)


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


# ---------------------------------------------------------------------------- scalars


def parse_flag(value: bool | str | None, flag: str) -> bool:
    """A switch from the command line (True) or its PET_ variable: `1`/`0` as torchrun reads them."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{flag} {value!r}: give 1 or 0")


def parse_whole(value: int | str, flag: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a whole number") from None


def parse_fraction(value: float | str, flag: str) -> float:
    """A number from 0 to 1 (0: off)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {value!r} is not a number") from None
    if not 0 <= x < 1:
        raise ConfigError(f"{flag} {value!r} must be from 0 (off) to below 1, a fraction of the job's median")
    return x


LOG_LEVELS = ("debug", "info", "warning", "error")


def parse_log_level(text: str | None) -> str:
    level = str(text or "info").strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log_level {text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def parse_choice(value: str, flag: str, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigError(f"{flag} {value!r} is not one of {', '.join(choices)}")
    return text


# What --preload imports unless `--preload_modules -NAME` drops it: what `import torch` leaves for the first
# DDP step to load, measured with a one-rank gloo step (824 modules, mostly sympy through torch._dynamo).
PRELOAD_DEFAULTS = (
    "torch",
    "torch.distributed",
    "torch.distributed.distributed_c10d",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.nn.parallel",
    "torch.optim",
    "torch._dynamo",
)


def parse_preload(preload: bool, modules: str | None) -> tuple[str, ...] | None:
    """`--preload` and `--preload_modules a,b.c,-torch._dynamo` → every module the zygote imports, in order:
    the defaults less each `-NAME` (and what lies under it), then the user's (None: no preload; any
    `--preload_modules` implies it)."""
    listed = [m.strip() for m in (modules or "").split(",") if m.strip()]
    if not preload and not listed:
        return None
    parse_modules(",".join(m.removeprefix("-") for m in listed))
    drop = [m[1:].strip() for m in listed if m.startswith("-")]
    add = [m for m in listed if not m.startswith("-")]
    for name in drop:
        if not any(_under(d, name) for d in PRELOAD_DEFAULTS):
            defaults = ", ".join(PRELOAD_DEFAULTS)
            raise ConfigError(f"--preload_modules -{name} drops nothing; the modules --preload imports are {defaults}")
    kept = [d for d in PRELOAD_DEFAULTS if not any(_under(d, n) for n in drop)]
    return tuple(dict.fromkeys([*kept, *add]))


def _under(module: str, name: str) -> bool:
    """`module` is `name` or lies in its package."""
    return module == name or module.startswith(name + ".")


def parse_modules(text: str | None, flag: str = "--preload_modules") -> tuple[str, ...]:
    """`a,b.c` → ("a", "b.c"): dotted module names."""
    names = tuple(m.strip() for m in (text or "").split(",") if m.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise ConfigError(f"{flag} {name!r} is not a module name (e.g. {flag} transformers,mypkg.model)")
    return names


def parse_numa_binding(text: str | None) -> NumaMode | None:
    """`--numa_binding MODE` → the mode (None: no binding)."""
    if text is None or str(text).strip() == "":
        return None
    try:
        return NumaMode(str(text).strip().lower())
    except ValueError:
        modes = ", ".join(m.value for m in NumaMode)
        raise ConfigError(f"--numa_binding {text!r} is not a mode; use one of {modes}") from None


def parse_worker_exit(text: str | None) -> WorkerExit:
    """`--worker_exit quick|finalize` → the mode."""
    try:
        return WorkerExit(str(text or "quick").strip().lower())
    except ValueError:
        modes = ", ".join(m.value for m in WorkerExit)
        raise ConfigError(f"--worker_exit {text!r} is not a mode; use one of {modes}") from None


RESTART_KEYS = {"quick", "backoff", "backoff_max", "no_progress", "deterministic"}
QUARANTINE_KEYS = {"after": "quarantine_after", "window": "quarantine_window", "cooldown": "quarantine_cooldown"}


def parse_policy(restart: dict[str, str], quarantine: dict[str, str]) -> RestartPolicy:
    """The two flags' key=value maps (config.parse_kv) into one RestartPolicy; ConfigError names the fix."""
    values: dict[str, object] = {}
    for key, text in restart.items():
        flag = f"--restart_policy {key}="
        if key not in RESTART_KEYS:
            raise ConfigError(f"--restart_policy key {key!r} is unknown; use {', '.join(sorted(RESTART_KEYS))}")
        if key == "deterministic":
            if text.lower() not in ("on", "off", "1", "0", "true", "false"):
                raise ConfigError(f"{flag}{text}: say on or off")
            values[key] = text.lower() in ("on", "1", "true")
        elif key == "no_progress":
            values[key] = _count(text, flag)
        else:
            values[key] = parse_seconds(text, flag)
    for key, text in quarantine.items():
        flag = f"--quarantine {key}="
        if key not in QUARANTINE_KEYS:
            raise ConfigError(f"--quarantine key {key!r} is unknown; use {', '.join(QUARANTINE_KEYS)}")
        values[QUARANTINE_KEYS[key]] = parse_seconds(text, flag) if key == "cooldown" else _count(text, flag)
    policy = RestartPolicy(**values)  # type: ignore[arg-type]
    if policy.backoff_max < policy.backoff:
        raise ConfigError(f"--restart_policy backoff_max={policy.backoff_max:g} is below backoff={policy.backoff:g}")
    if policy.quarantine_window and not 1 <= policy.quarantine_after <= policy.quarantine_window:
        raise ConfigError(
            f"--quarantine after={policy.quarantine_after} must be from 1 to window={policy.quarantine_window}"
        )
    return policy


def _count(text: str, flag: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"{flag}{text} is not a whole number") from None
    if n < 0:
        raise ConfigError(f"{flag}{text} must be 0 or more")
    return n


def parse_recovery(text: str | None, max_nodes: int, environ: Mapping[str, str]) -> RecoveryMode:
    """`--recovery restart|in-place`; in place needs the agent's bootstrap store (`max_nodes`: any)."""
    try:
        mode = RecoveryMode(str(text or "restart").strip().lower().replace("_", "-"))
    except ValueError:
        modes = ", ".join(m.value for m in RecoveryMode)
        raise ConfigError(f"--recovery {text!r} is not a mode; use one of {modes}") from None
    if mode is RecoveryMode.IN_PLACE and environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") == "1":
        raise ConfigError(
            "--recovery in-place needs the launcher's store, which TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "turns off; unset it"
        )
    return mode
