"""The etcd backend's settings: the cluster, TLS files and credentials from `--rdzv_endpoint`,
`--rdzv_conf` and the environment, checked and read once at config time (no etcd client here)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ...errors import ConfigError
from ...parsers import parse_endpoint
from ..settings import (
    ETCD_KEYS,
    ETCD_PASSWORD_ENV,
    ETCD_USER_ENV,
    RDZV_KEYS,
    Flags,
    RendezvousSettings,
    parse_rdzv_settings,
)

ETCD_PORT = 2379


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach and log in to the cluster; the password never shows in a repr."""

    endpoints: tuple[tuple[str, int], ...]
    tls: bool = False
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = 10.0  # one request
    engine: str = "gateway"  # or "grpc" (--rdzv_conf engine=grpc; the etcd-grpc extra)

    @property
    def where(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)


@dataclass(frozen=True)
class EtcdSettings:
    """`etcd`: the cluster (what the etcd engines are given) and the elastic timing."""

    cluster: EtcdOptions
    rdzv: RendezvousSettings = RendezvousSettings()


def parse_etcd(flags: Flags) -> EtcdSettings:
    """Validate the endpoints, the etcd keys of `--rdzv_conf` and the credentials together."""
    conf, environ = flags.conf, flags.environ
    if not flags.endpoint:
        raise ConfigError("--rdzv_backend etcd needs --rdzv_endpoint HOST[:PORT][,HOST[:PORT]…] (the etcd cluster)")
    endpoints, https = parse_endpoints(flags.endpoint, ETCD_PORT)
    if "is_host" in conf:
        raise ConfigError("--rdzv_conf is_host does not apply to the etcd rendezvous (no node hosts etcd); remove it")
    if "password" in conf:
        raise ConfigError(
            f"--rdzv_conf password= would show in ps; set {ETCD_PASSWORD_ENV} or use --rdzv_conf password_file=PATH"
        )
    for key in ("cacert", "cert", "key", "password_file"):
        if key in conf and not os.path.isfile(conf[key]):
            raise ConfigError(f"--rdzv_conf {key}={conf[key]}: no such file")
    if ("cert" in conf) != ("key" in conf):
        raise ConfigError("--rdzv_conf cert= and key= go together (the client certificate and its key)")
    if conf.get("protocol", "http") not in ("http", "https"):
        raise ConfigError(f"--rdzv_conf protocol={conf['protocol']} is not http or https")
    if conf.get("engine", "gateway") not in ("gateway", "grpc"):
        raise ConfigError(f"--rdzv_conf engine={conf['engine']} is not gateway or grpc")
    if conf.get("engine") == "grpc":
        import importlib.util  # finds, does not import: grpc stays out of the config step

        if importlib.util.find_spec("pyetcd") is None:
            from ...install import command

            raise ConfigError(f"--rdzv_conf engine=grpc needs etcd's gRPC client: {command('etcd-grpc')}")
    user = conf.get("user") or environ.get(ETCD_USER_ENV) or None
    has_password = bool(environ.get(ETCD_PASSWORD_ENV)) or "password_file" in conf
    if has_password and not user:
        raise ConfigError(f"an etcd password is set but no user; set {ETCD_USER_ENV} or --rdzv_conf user=NAME")
    if user and not has_password:
        raise ConfigError(
            f"etcd user {user!r} has no password; set {ETCD_PASSWORD_ENV} or --rdzv_conf password_file=PATH"
        )
    unknown = sorted(set(conf) - set(ETCD_KEYS) - set(RDZV_KEYS))
    if unknown:
        good = sorted(set(ETCD_KEYS) | set(RDZV_KEYS) - {"is_host"})
        raise ConfigError(f"--rdzv_conf {unknown[0]} is not an etcd rendezvous setting; use one of {', '.join(good)}")
    rdzv = parse_rdzv_settings({k: v for k, v in conf.items() if k not in ETCD_KEYS})
    cluster = EtcdOptions(
        endpoints=endpoints,
        tls=https or conf.get("protocol") == "https" or any(k in conf for k in ("cacert", "cert", "key")),
        cacert=conf.get("cacert"),
        cert=conf.get("cert"),
        key=conf.get("key"),
        user=user,
        password=_password(conf.get("password_file"), environ),
        timeout=min(rdzv.read_timeout, 10.0),
        engine=conf.get("engine", "gateway"),
    )
    return EtcdSettings(cluster, rdzv)


def parse_endpoints(
    text: str, default_port: int, flag: str = "--rdzv_endpoint"
) -> tuple[tuple[tuple[str, int], ...], bool]:
    """`h1:2379,h2[:port],…`, each optionally `http://` or `https://` (etcd's own spelling) ->
    (the unique endpoints, whether one of them says https)."""
    out, https = [], False
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        scheme = re.match(r"https?://", item)
        https = https or (scheme is not None and scheme.group() == "https://")
        out.append(parse_endpoint(item[scheme.end() if scheme else 0 :].rstrip("/"), default_port, flag))
    if not out:
        raise ConfigError(f"{flag} is empty; give HOST[:PORT][,HOST[:PORT]…]")
    return tuple(dict.fromkeys(out)), https


def _password(path: str | None, environ) -> str | None:
    """The password from its file (`--rdzv_conf password_file=`), else from the environment."""
    if not path:
        return environ.get(ETCD_PASSWORD_ENV) or None
    try:
        with open(path) as f:
            return f.read().rstrip("\r\n")
    except OSError as e:
        raise ConfigError(f"--rdzv_conf password_file={path}: {e.strerror}") from None
