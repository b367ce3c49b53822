"""Bad input: property tests over the flags, the CLI and `--rdzv_conf`, and hostile data in the store.

Every invalid flag value must be a ConfigError: one line on stderr and exit 2, never a traceback;
every value that is accepted must be one the launcher can actually use (a finite timeout, a run id
that makes a folder). Data under the job's prefix in the store that the protocol did not write
(garbage, wrong types, huge or oversized values) must be rejected or survived, never crash an agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import json
import math
import os
import threading
import time
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import worker
from support.rendezvous import agents, client

from launcher import cli
from launcher import config as cfg
from launcher.errors import ConfigError, LauncherError, RendezvousError
from launcher.rendezvous.etcd_settings import ETCD_KEYS
from launcher.rendezvous.settings import RDZV_KEYS, RendezvousSettings, parse_rdzv_settings
from launcher.run import make_run_dir

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
        mock.patch("launcher.run.run", return_value=0),
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


# ---------------------------------------------------------------------------- the command line, real processes


@pytest.mark.parametrize(
    "args",
    [
        ["--nnodes", "0", SCRIPT],
        ["--max_restarts", "-1", SCRIPT],
        [
            "--nnodes",
            "2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "h:1",
            "--rdzv_conf",
            "join_timeout=inf",
            SCRIPT,
        ],
        [
            "--nnodes",
            "2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "h:1",
            "--rdzv_conf",
            "read_timeout=1e400",
            SCRIPT,
        ],
        ["--monitor_interval", "1e300", SCRIPT],
        ["--rdzv_conf", "=", SCRIPT],
        ["--nproc_per_node", "\u0663x", SCRIPT],
        ["--bogus", SCRIPT],
        ["store", "--port", "99999"],
        ["store", "--host", "10.255.255.254", "--port", "0"],
    ],
    ids=lambda a: " ".join(a)[:40],
)
def test_real_cli_bad_input_one_line_exit_2(launch, args):
    r = launch.run(*args, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------- hostile data in the store

from launcher.rendezvous.api import Cause  # noqa: E402
from launcher.rendezvous.protocol import MAX_VALUE, ElasticRendezvous  # noqa: E402
from launcher.spec import Round  # noqa: E402


def join(rdzvs: list[ElasticRendezvous], timeout: float = 40) -> list[object]:
    """Every node asks for its first round at once; each gets a Round or the exception it raised."""
    results: list[object] = [None] * len(rdzvs)

    def ask(i: int) -> None:
        try:
            results[i] = rdzvs[i].next_round(Cause.START)
        except BaseException as e:  # noqa: BLE001 - the test sorts clean errors from crashes
            results[i] = e

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(rdzvs))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a node hung on hostile store data"
    return results


def sane(result: object) -> None:
    """A Round whose every field has its proper type and range, or a clean launcher error."""
    if isinstance(result, LauncherError):
        assert str(result) and len(str(result)) < 1000, str(result)[:200]
        return
    assert isinstance(result, Round), f"crashed: {type(result).__name__}: {result}"
    for name in (
        "round",
        "restart_count",
        "group_rank",
        "group_world_size",
        "rank_offset",
        "world_size",
        "master_port",
    ):
        v = getattr(result, name)
        assert type(v) is int and 0 <= v < 1 << 31, (name, v)
    assert 0 <= result.group_rank < result.group_world_size and 0 < result.master_port < 65536
    assert type(result.master_addr) is str and 0 < len(result.master_addr) <= 255


def formed(results: list[object], nodes: int) -> None:
    """Every real node got a round with all of them in it (2 workers each), with distinct group ranks."""
    for r in results:
        sane(r)
        assert isinstance(r, Round), r
    assert sorted(r.group_rank for r in results) == list(range(nodes))
    assert {r.world_size for r in results} == {2 * nodes}


GARBAGE = [b"\xff\xfe\x00 garbage", b"-1", b"9" * 40, b"x" * (1 << 20)]


@pytest.mark.parametrize("key", ["round", "closed", "restarts", "token", "r0/joined", "r0/sealed", "r0/change"])
@pytest.mark.parametrize("garbage", GARBAGE, ids=["binary", "negative", "huge-number", "1MiB"])
def test_garbage_under_the_job_prefix_never_crashes_a_node(store_port, key, garbage):
    client(store_port).set(f"job/{key}", garbage)
    results = join(agents(store_port, 2, 2, 2))
    for r in results:
        sane(r)  # a round, or one clear error (the job cannot go on with its own counters garbled)


DESCRIPTORS = {
    "not-json": b"{nope",
    "oversized": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": 1, "pad": "x" * MAX_VALUE}).encode(),
    "a-list": b"[1, 2, 3]",
    "nproc-string": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": "2", "prev": -1}).encode(),
    "nproc-huge": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": 2**40, "prev": -1}).encode(),
    "nproc-negative": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": -3, "prev": -1}).encode(),
    "addr-number": json.dumps({"id": "x", "addr": 123, "port": 1, "nproc": 1, "prev": -1}).encode(),
    "addr-huge": json.dumps({"id": "x", "addr": "a" * 60000, "port": 1, "nproc": 1, "prev": -1}).encode(),
    "port-string": json.dumps({"id": "x", "addr": "1.2.3.4", "port": "x", "nproc": 1, "prev": -1}).encode(),
    "port-out-of-range": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 70000, "nproc": 1, "prev": -1}).encode(),
    "prev-bool": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": 1, "prev": True}).encode(),
    "fields-missing": json.dumps({"id": "x"}).encode(),
    "never-written": None,  # a node that took a ticket and died before writing its entry
}


@pytest.mark.parametrize("nnodes", [(2, 3), (2, 2)], ids=["elastic", "fixed"])
@pytest.mark.parametrize("what", list(DESCRIPTORS))
def test_a_malformed_node_entry_is_left_out_and_the_real_nodes_form(store_port, what, nnodes):
    hostile = client(store_port)
    ticket = hostile.add("job/r0/joined", 1)  # first in line: the real nodes come after it
    if DESCRIPTORS[what] is not None:
        hostile.set(f"job/r0/node{ticket}", DESCRIPTORS[what])
    formed(join(agents(store_port, 2, *nnodes)), nodes=2)


@pytest.mark.parametrize(
    "plan",
    [
        {
            "group_rank": "0",
            "group_world_size": 2,
            "rank_offset": 0,
            "world_size": 4,
            "master_addr": "h",
            "master_port": 1,
            "restarts": 0,
        },
        {
            "group_rank": 0,
            "group_world_size": 2,
            "rank_offset": 0,
            "world_size": 4,
            "master_addr": ["h"],
            "master_port": 1,
            "restarts": 0,
        },
        {
            "group_rank": 5,
            "group_world_size": 2,
            "rank_offset": 0,
            "world_size": 4,
            "master_addr": "h",
            "master_port": 1,
            "restarts": 0,
        },
        {"group_rank": 0},
        "not a plan",
    ],
    ids=["rank-string", "addr-list", "rank-out-of-range", "fields-missing", "a-string"],
)
def test_a_hostile_sealer_with_a_malformed_plan_is_a_clean_error(store_port, plan):
    """A rogue client joins as the second node, seals the round and writes the first node a bad plan."""
    [real] = agents(store_port, 1, 2, 2)
    results: list[object] = []
    t = threading.Thread(target=lambda: results.extend(join([real])), daemon=True)
    t.start()
    rogue = client(store_port)
    assert rogue.wait(["job/r0/node1"], 20)  # the real node has its ticket and its entry
    k = rogue.add("job/r0/joined", 1)
    rogue.set(
        f"job/r0/node{k}", json.dumps({"id": "rogue", "addr": "10.0.0.9", "port": 5, "nproc": 2, "prev": -1}).encode()
    )
    rogue.compare_set("job/r0/sealed", b"", f"{k}:rogue".encode())
    rogue.set("job/r0/plan1", json.dumps(plan).encode())
    t.join(30)
    assert len(results) == 1
    sane(results[0])
    assert isinstance(results[0], RendezvousError), results[0]


def test_garbage_under_another_run_id_does_not_matter(store_port):
    hostile = client(store_port)
    for key in ("round", "closed", "restarts", "r0/joined", "r0/sealed", "r0/node1", "r0/plan1"):
        for other in ("jobX", "jo", "job/r0"):  # other runs, also ones whose keys start like ours
            hostile.set(f"{other}/{key}", b"\xffgarbage")
    formed(join(agents(store_port, 2, 2, 2)), nodes=2)
