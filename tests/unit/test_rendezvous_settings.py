"""The rendezvous backends' settings, parsed once at config time: `--rdzv_conf` timings, and the
etcd backend's cluster, TLS files and credentials (no etcd client is made here)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from launcher.errors import ConfigError
from launcher.rendezvous.etcd.settings import ETCD_PASSWORD_ENV, ETCD_USER_ENV, parse_endpoints, parse_etcd
from launcher.rendezvous.settings import Flags, RendezvousSettings, parse_rdzv_settings

# ---------------------------------------------------------------------------- --rdzv_conf timings


def test_every_timing_key_is_honoured():
    s = parse_rdzv_settings(
        {
            "join_timeout": "90",
            "last_call_timeout": "2",
            "read_timeout": "7",
            "keep_alive_interval": "0.25",
            "keep_alive_max_attempt": "8",
            "is_host": "no",
        }
    )
    assert (s.join_timeout, s.last_call_timeout, s.read_timeout) == (90.0, 2.0, 7.0)
    assert s.liveness_timeout == 2.0 and s.is_host is False
    assert parse_rdzv_settings({}) == RendezvousSettings()


@pytest.mark.parametrize(
    "conf, needle",
    [
        ({"joint_timeout": "1"}, "is not a rendezvous setting; use one of"),
        ({"is_host": "maybe"}, "is not true or false"),
        ({"keep_alive_max_attempt": "2.5"}, "is not a whole number"),
        ({"keep_alive_max_attempt": "0"}, "must be at least 1"),
        ({"keep_alive_interval": "0"}, "must be at least 0.001"),
        ({"join_timeout": "inf"}, "must be at most"),
        ({"keep_alive_interval": "1000", "keep_alive_max_attempt": "100000"}, "must be at most"),
    ],
)
def test_bad_timings_are_one_line(conf, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        parse_rdzv_settings(conf)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------- etcd


def etcd(endpoint: str = "10.0.0.1:2379", environ: dict | None = None, **conf: str):
    return parse_etcd(Flags(endpoint=endpoint, conf=conf, environ=environ or {}))


def test_endpoints_are_unique_with_the_default_port_and_an_https_scheme_means_tls():
    assert parse_endpoints("a,b:1,a:2379, http://c/", 2379) == ((("a", 2379), ("b", 1), ("c", 2379)), False)
    assert parse_endpoints("https://a:1", 2379) == ((("a", 1),), True)
    with pytest.raises(ConfigError, match="is empty"):
        parse_endpoints(" , ", 2379)


def test_a_plain_cluster_and_one_over_tls():
    plain = etcd(join_timeout="30")
    assert plain.cluster.endpoints == (("10.0.0.1", 2379),) and not plain.cluster.tls
    assert plain.cluster.engine == "gateway" and plain.rdzv.join_timeout == 30.0
    assert etcd("https://h:1").cluster.tls and etcd(protocol="https").cluster.tls


def test_tls_files_must_exist_and_a_cert_needs_its_key(tmp_path):
    ca, cert, key = (tmp_path / n for n in ("ca.crt", "c.crt", "c.key"))
    for f in (ca, cert, key):
        f.write_text("x")
    s = etcd(cacert=str(ca), cert=str(cert), key=str(key))
    assert s.cluster.tls and (s.cluster.cacert, s.cluster.cert, s.cluster.key) == (str(ca), str(cert), str(key))
    with pytest.raises(ConfigError, match="no such file"):
        etcd(cacert=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="cert= and key= go together"):
        etcd(cert=str(cert))


def test_credentials_come_in_pairs_and_the_password_never_from_the_command_line(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("hunter2\n")
    s = etcd(user="train", password_file=str(pw))
    assert (s.cluster.user, s.cluster.password) == ("train", "hunter2")
    assert "hunter2" not in repr(s)
    env = etcd(environ={ETCD_USER_ENV: "u", ETCD_PASSWORD_ENV: "p"})
    assert (env.cluster.user, env.cluster.password) == ("u", "p")
    with pytest.raises(ConfigError, match="would show in ps"):
        etcd(password="x")
    with pytest.raises(ConfigError, match="but no user"):
        etcd(environ={ETCD_PASSWORD_ENV: "p"})
    with pytest.raises(ConfigError, match="has no password"):
        etcd(user="train")


@pytest.mark.parametrize(
    "endpoint, conf, needle",
    [
        ("", {}, "needs --rdzv_endpoint"),
        ("h", {"is_host": "true"}, "is_host does not apply"),
        ("h", {"protocol": "ftp"}, "is not http or https"),
        ("h", {"engine": "rest"}, "is not gateway or grpc"),
        ("h", {"colour": "blue"}, "is not an etcd rendezvous setting"),
        ("h:99999", {}, "is not a port number"),
    ],
)
def test_bad_etcd_settings_are_one_line(endpoint, conf, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        etcd(endpoint, **conf)
    assert "\n" not in str(e.value)


def test_the_grpc_engine_needs_its_extra(monkeypatch):
    """--rdzv_conf engine=grpc without etcd-sdk-python installed: a config error that names the extra."""

    from launcher.config import from_flags
    from launcher.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyetcd" else real(name, *a))
    from launcher.install import command

    needs = f"engine=grpc needs etcd's gRPC client: {command('etcd-grpc')}"
    assert "pip install -e '" in needs and "[etcd-grpc]'" in needs  # a checkout: the extra from the checkout
    with pytest.raises(ConfigError, match=re.escape(needs)):
        from_flags(
            training_script="x",
            no_python=True,
            rdzv_backend="etcd",
            rdzv_endpoint="127.0.0.1:2379",
            rdzv_conf="engine=grpc",
            environ={},
        )
