"""Bad flags: property tests over the flags, the CLI (in this process) and `--rdzv_conf`.

Every invalid flag value must be a ConfigError: one line on stderr and exit 2, never a traceback;
every value that is accepted must be one the launcher can actually use (a finite timeout, a run id
that makes a folder). The same with real processes: tests/e2e/test_cli_bad_input.py; hostile data
in the store: tests/integration/test_hostile_store_data.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import math
import os
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import worker

from launcher import config as cfg
from launcher.cli import commands as cli
from launcher.cli.run import make_run_dir
from launcher.errors import ConfigError
from launcher.rendezvous.etcd.settings import ETCD_KEYS
from launcher.rendezvous.settings import RDZV_KEYS, RendezvousSettings, parse_rdzv_settings

SCRIPT = worker("echo_args.py")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------- strategies

TRICKY = [
    "",
    " ",
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "1.5",
    "-2.5",
    "1e3",
    "1e-9",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e309",
    "1e400",
    "9" * 30,
    "9" * 5000,
    "0x10",
    "0o7",
    "1_000",
    " 3 ",
    "\u0663",
    "\u00b2",
    "1:2",
    "2:1",
    "0:0",
    "1:",
    ":1",
    "1:2:3",
    "a=b",
    "=",
    "==",
    ",",
    ",,",
    "a",
    "true",
    "false",
    "yes",
    "none",
    "null",
    "gpu",
    "cpu",
    "auto",
    "\n",
    "\t",
    "\U0001f4a5",
    "../x",
    "/",
    "a/b",
    "x" * 300,
    "SIGTERM",
    "SIGKILL",
    "USR1",
    "99",
    "0:1,1:3",
    "12:3",
    "3:9",
    "[::1]:29400",
    "h:99999",
    "h:0",
    "h:-1",
    "http://h:2379",
    "static",
    "c10d",
    "etcd",
    "etcd-v2",
    "local",
]
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
value = st.one_of(st.sampled_from(TRICKY), text, st.integers().map(str), st.floats().map(repr))

STRING_FLAGS = [
    "nnodes",
    "nproc_per_node",
    "node_rank",
    "master_addr",
    "master_port",
    "local_addr",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "max_restarts",
    "monitor_interval",
    "role",
    "redirects",
    "tee",
    "local_ranks_filter",
    "signals_to_handle",
    "passthrough_signals",
    "shutdown_timeout",
    "append_local_rank_as",
    "gpus",
    "hang_timeout",
]
BOOL_FLAGS = ["standalone", "module", "no_python", "run_path", "virtual_local_rank", "append_local_rank", "use_env"]
conf_key = st.one_of(st.sampled_from(sorted(RDZV_KEYS) + ["join_timeout"] * 3 + list(ETCD_KEYS)), text)
rdzv_conf = st.lists(st.tuples(conf_key, value), max_size=4).map(lambda kv: ",".join(f"{k}={v}" for k, v in kv))


def usable_seconds(x: float | None) -> bool:
    """A timeout the launcher can hand to select(), TCPStore and etcd without overflowing."""
    if x is None:
        return True
    if not (math.isfinite(x) and x >= 0):
        return False
    datetime.timedelta(seconds=x)
    return x * 1000 < 2**31  # select/poll take milliseconds as a C int


def check_usable(c: cfg.LaunchConfig, tmp_path) -> None:
    for name in ("monitor_interval", "shutdown_timeout", "hang_timeout"):
        assert usable_seconds(getattr(c, name)), (name, getattr(c, name))
    r = getattr(c.rendezvous, "rdzv", RendezvousSettings())  # the elastic backends' timing
    for name in ("join_timeout", "last_call_timeout", "keep_alive_interval", "read_timeout", "exit_barrier_timeout"):
        assert usable_seconds(getattr(r, name)), (name, getattr(r, name))
    assert usable_seconds(r.liveness_timeout), r
    run_dir, _ = make_run_dir(dataclasses.replace(c, log_dir=str(tmp_path)))  # any accepted run id makes a folder
    assert os.path.dirname(run_dir) == str(tmp_path)


# ---------------------------------------------------------------------------- pure parsers


@FUZZ
@given(conf=st.dictionaries(conf_key, value, max_size=5))
def test_rdzv_conf_is_a_config_error_or_usable_settings(conf):
    try:
        s = parse_rdzv_settings(conf)
    except ConfigError as e:  # (newlines a value carries are escaped when the CLI prints it: see below)
        assert str(e).startswith("--rdzv_conf ")
        return
    for name in ("join_timeout", "last_call_timeout", "keep_alive_interval", "read_timeout", "exit_barrier_timeout"):
        assert usable_seconds(getattr(s, name)), (name, s)
    assert usable_seconds(s.liveness_timeout), s
    assert s.keep_alive_interval > 0 and s.keep_alive_max_attempt >= 1


@FUZZ
@given(data=st.data())
def test_from_flags_is_a_config_error_or_a_usable_config(data, tmp_path_factory):
    flags = {f: data.draw(value, label=f) for f in data.draw(st.sets(st.sampled_from(STRING_FLAGS), max_size=6))}
    flags.update({f: True for f in data.draw(st.sets(st.sampled_from(BOOL_FLAGS), max_size=2))})
    if data.draw(st.booleans(), label="random rdzv_conf"):
        flags["rdzv_conf"] = data.draw(rdzv_conf, label="rdzv_conf")
    script = data.draw(st.sampled_from([SCRIPT, "", "no-such-script.py"]) | text, label="script")
    try:
        c = cfg.from_flags(training_script=script, environ={}, **flags)
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message.strip() and "Traceback" not in message
        return
    check_usable(c, tmp_path_factory.mktemp("runs"))


# ---------------------------------------------------------------------------- the command line, in process


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`launcher ARGV` in this process with the job itself stubbed out: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch("launcher.cli.run.run", return_value=0),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            cli.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


CLI_FLAGS = (
    [f"--{f}" for f in STRING_FLAGS] + [f"--{f.replace('_', '-')}" for f in STRING_FLAGS[:6]] + ["-r", "-t", "--bogus"]
)


@FUZZ
@given(data=st.data())
def test_cli_any_flags_exit_0_or_one_line_and_exit_2(data):
    argv: list[str] = []
    for flag in data.draw(st.lists(st.sampled_from(CLI_FLAGS), max_size=5), label="flags"):
        argv += [flag, data.draw(value, label=flag)]
    argv += data.draw(
        st.lists(st.sampled_from(["--" + f.replace("_", "-") for f in BOOL_FLAGS]), max_size=2), label="bools"
    )
    argv += [
        data.draw(st.sampled_from([SCRIPT, "missing.py", "-"]), label="script"),
        *data.draw(st.lists(value, max_size=2)),
    ]
    code, out, err = run_cli(argv)
    if code == 0:
        assert err == "", err
        return
    assert code == 2, (argv, code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launcher: error: "), (argv, err)


@FUZZ
@given(host=st.one_of(st.sampled_from(["999.1.1.1", "", "::::", "a b", "localhost"]), text), port=value)
def test_store_subcommand_bad_host_or_port_is_one_line(host, port):
    with mock.patch("launcher.rendezvous.c10d.store_main", side_effect=OSError(99, "Cannot assign requested address")):
        code, out, err = run_cli(["store", "--host", host, "--port", port])
    assert code == 2, (host, port, code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launcher store: error: "), err
