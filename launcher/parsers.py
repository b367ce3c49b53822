"""Pure parsers of single values (ports, endpoints, seconds), shared by `config` and the rendezvous
backends' settings; each raises `ConfigError` with a one-line message that names the fix."""

from __future__ import annotations

import re

from .errors import ConfigError


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
