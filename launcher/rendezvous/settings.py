"""What each store-less or TCPStore backend needs from `--rdzv_endpoint`/`--rdzv_conf`, parsed once.

`config.from_flags` calls a backend's parser (through the table in `rendezvous/__init__`) and keeps
the frozen result in `LaunchConfig.rendezvous`; the backend uses it as is. The elastic timing
settings (`RendezvousSettings`) are shared by the dynamic backends (c10d and etcd). The etcd
backend's own settings are in `etcd.settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..parsers import MAX_SECONDS, parse_endpoint, parse_seconds

DEFAULT_MASTER_PORT = 29500
C10D_PORT = 29400


@dataclass(frozen=True)
class Flags:
    """What a backend's settings are parsed from: its two flags and the few general ones some read."""

    endpoint: str = ""  # --rdzv_endpoint as given
    conf: Mapping[str, str] = field(default_factory=dict)  # --rdzv_conf, the join token taken out
    environ: Mapping[str, str] = field(default_factory=dict)
    nnodes: str = "1:1"  # as given, for messages
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    local_addr: str | None = None


@dataclass(frozen=True)
class RendezvousSettings:
    """The `--rdzv_conf` keys the elastic rendezvous honours, with their documented defaults."""

    join_timeout: float = 600.0  # a round must form within this (torch: join_timeout, alias timeout)
    last_call_timeout: float = 30.0  # after MIN nodes joined, wait this long for more before sealing
    keep_alive_interval: float = 0.5  # heartbeat period
    keep_alive_max_attempt: int = 12  # missed heartbeats before a node is declared dead (6 s: docs/rendezvous.md)
    read_timeout: float = 60.0  # one store operation
    exit_barrier_timeout: float = 300.0  # how long the store host waits for the others to finish
    # A job left below MIN waits this long for a node to replace a lost one: a node restarted by systemd or
    # by hand is back within a minute, one requeued by Slurm or rebooted within a few; past five minutes of
    # idle GPUs, ending the job (a scheduler requeues it whole, from its checkpoint) costs less.
    replace_timeout: float = 300.0
    is_host: bool | None = None  # host the store on this node; None: decide by address

    @property
    def liveness_timeout(self) -> float:
        return self.keep_alive_interval * self.keep_alive_max_attempt


RDZV_KEYS = {
    "join_timeout": "join_timeout",
    "timeout": "join_timeout",
    "last_call_timeout": "last_call_timeout",
    "keep_alive_interval": "keep_alive_interval",
    "keep_alive_max_attempt": "keep_alive_max_attempt",
    "read_timeout": "read_timeout",
    "exit_barrier_timeout": "exit_barrier_timeout",
    "replace_timeout": "replace_timeout",
    "is_host": "is_host",
}
# `--rdzv_conf` keys of the etcd backend beside the rendezvous settings; a password never is one (ps shows it).
ETCD_KEYS = ("cacert", "cert", "key", "user", "password_file", "protocol", "engine")
ETCD_USER_ENV, ETCD_PASSWORD_ENV = "LAUNCHER_ETCD_USER", "LAUNCHER_ETCD_PASSWORD"
# (These three here, not in etcd.settings, which loads only for etcd: the config's table of known keys
# and the workers' environment, which never holds the password, name them on every launch.)


def parse_rdzv_settings(conf: Mapping[str, str]) -> RendezvousSettings:
    """Honour every known `--rdzv_conf` key; reject the rest with the list of good ones."""
    values: dict[str, object] = {}
    for key, text in conf.items():
        field_name = RDZV_KEYS.get(key)
        if field_name is None:
            raise ConfigError(
                f"--rdzv_conf {key} is not a rendezvous setting; use one of {', '.join(sorted(RDZV_KEYS))}"
            )
        if field_name == "is_host":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ConfigError(f"--rdzv_conf is_host={text} is not true or false")
            values[field_name] = text.lower() in ("true", "1", "yes")
        elif field_name == "keep_alive_max_attempt":
            try:
                values[field_name] = int(text)
            except ValueError:
                raise ConfigError(f"--rdzv_conf {key}={text} is not a whole number") from None
            if values[field_name] < 1:  # type: ignore[operator]
                raise ConfigError(f"--rdzv_conf {key}={text} must be at least 1")
        else:
            values[field_name] = parse_seconds(text, f"--rdzv_conf {key}", minimum=0.001 if "interval" in key else 0.0)
    settings = RendezvousSettings(**values)  # type: ignore[arg-type]
    if settings.liveness_timeout > MAX_SECONDS:
        raise ConfigError(
            f"--rdzv_conf keep_alive_interval x keep_alive_max_attempt must be at most {MAX_SECONDS:g} seconds"
        )
    return settings


# ---------------------------------------------------------------------------- the backends' settings


@dataclass(frozen=True)
class LocalSettings:
    """`local` (one node, `--standalone` or the default): a free port on `addr` every round."""

    addr: str = "127.0.0.1"  # where the workers' bootstrap store listens (--local_addr)


@dataclass(frozen=True)
class StaticSettings:
    """`static`: fixed ranks; every node names the same bootstrap store, rank 0's."""

    master_addr: str
    master_port: int
    node_rank: int


@dataclass(frozen=True)
class C10dSettings:
    """`c10d`: the protocol on a TCPStore at `host:port`."""

    host: str
    port: int
    rdzv: RendezvousSettings = RendezvousSettings()


def parse_local(flags: Flags) -> LocalSettings:
    _only_timeout(flags.conf, "local")
    return LocalSettings(flags.local_addr or "127.0.0.1")


def parse_static(flags: Flags) -> StaticSettings:
    if flags.min_nodes != flags.max_nodes:
        raise ConfigError(f"--nnodes {flags.nnodes} is elastic; static rendezvous needs a fixed --nnodes N")
    if not 0 <= flags.node_rank < flags.max_nodes:
        raise ConfigError(
            f"--node_rank {flags.node_rank} is out of range for --nnodes {flags.max_nodes} (0..{flags.max_nodes - 1})"
        )
    addr, port = flags.master_addr, flags.master_port
    if flags.endpoint:
        addr, port = parse_endpoint(flags.endpoint, DEFAULT_MASTER_PORT)
    port = DEFAULT_MASTER_PORT if port is None else port
    if port == 0:
        raise ConfigError("--master_port 0 cannot be shared between nodes; give a fixed port")
    _only_timeout(flags.conf, "static")
    return StaticSettings(addr, port, flags.node_rank)


def parse_c10d(flags: Flags) -> C10dSettings:
    if not flags.endpoint:
        raise ConfigError("--rdzv_backend c10d needs --rdzv_endpoint HOST[:PORT] (the store's address)")
    host, port = parse_endpoint(flags.endpoint, C10D_PORT)
    return C10dSettings(host, port, parse_rdzv_settings(flags.conf))


def _only_timeout(conf: Mapping[str, str], backend: str) -> None:
    """`timeout` is static's store timeout in torchrun; meaningless without an agent store, so accepted."""
    unknown = sorted(set(conf) - {"timeout"})
    if unknown:
        raise ConfigError(f"--rdzv_conf {unknown[0]} does not apply to the {backend} rendezvous; remove it")
