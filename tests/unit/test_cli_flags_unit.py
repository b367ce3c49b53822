"""The command line's parsing, in-process: the one table of defaults, torchrun's spellings and
environment switches, and what a torchrun line gets instead of an error (issue 24)."""

from __future__ import annotations

import os

import click
import pytest

from launcher import config as cfg
from launcher import parsers
from launcher.cli import commands as cli
from launcher.errors import ConfigError


def parse(args: list[str], env: dict[str, str] | None = None) -> dict:
    """The keyword arguments click hands `from_flags` for `args`, with `env` as the whole environment."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env or {})
    try:
        ctx = cli.command.make_context("launcher", list(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return dict(ctx.params)


def build(args: list[str], env: dict[str, str] | None = None) -> cfg.LaunchConfig:
    flags = parse(args, env)
    return cfg.from_flags(environ=env or {}, **flags)


def test_every_launch_flag_takes_its_default_from_the_table():
    options = {p.name: p for p in cli.command.params if isinstance(p, click.Option) and p.name not in ("version",)}
    assert set(options) == set(cfg.DEFAULTS)
    for name, option in options.items():
        assert option.default == cfg.DEFAULTS[name], name


def test_from_flags_fills_what_is_left_out_from_the_table():
    c = cfg.from_flags(training_script="true", no_python=True, environ={})
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node, c.max_restarts, c.role) == (1, 1, 1, 0, "default")
    with pytest.raises(ConfigError, match="--bogus is not a launcher option"):
        cfg.from_flags(training_script="true", no_python=True, environ={}, bogus=1)


@pytest.mark.parametrize("spelling", ["--nproc-per-node", "--nproc_per_node"])
def test_both_spellings(spelling):
    assert build([spelling, "3", "--no-python", "true"]).nproc_per_node == 3


def test_pet_module_and_pet_no_python_are_honoured():
    """torchrun: PET_MODULE=1 runs `python -m`; with PET_NO_PYTHON=1 too it is a usage error; 0 is off."""
    c = build(["json.tool"], {"PET_MODULE": "1"})
    assert c.module and c.program[-2:] == ("-m", "json.tool")
    assert build(["true"], {"PET_NO_PYTHON": "1", "PET_MODULE": "0"}).program == ("true",)
    with pytest.raises(ConfigError, match="-m and --no_python"):
        build(["true"], {"PET_NO_PYTHON": "1", "PET_MODULE": "1"})


def test_every_flag_has_its_pet_variable():
    for p in cli.command.params:
        if isinstance(p, click.Option) and p.name in cfg.DEFAULTS and p.name != "log_level":
            assert p.envvar == f"PET_{p.name.upper()}", p.name


def test_run_path_wins_over_no_python_and_module():
    assert build(["--run-path", "--no-python", __file__]).program[-1] == __file__


def test_rdzv_conf_quoted_whole_in_argv():
    """`--rdzv-conf='a=1,b=2'` through a subprocess list or YAML arrives with its quotes."""
    conf = parsers.parse_kv("'join_timeout=5,last_call_timeout=1,timeout=5'")
    assert conf == {"join_timeout": "5", "last_call_timeout": "1", "timeout": "5"}
    assert parsers.parse_kv('"a=1"') == {"a": "1"} and parsers.parse_kv("a='x y'") == {"a": "x y"}
    c = build(
        [
            "--nnodes=1:2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:29400",
            "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
            "--no-python",
            "true",
        ]
    )
    assert (c.rendezvous.rdzv.join_timeout, c.rendezvous.rdzv.last_call_timeout) == (5.0, 1.0)
    assert c.notes == ()


def test_unknown_rdzv_conf_key_is_one_note_naming_a_near_key_if_any():
    c = build(
        ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--rdzv-conf=join_timout=5", "--no-python", "true"]
    )
    assert c.rendezvous.rdzv.join_timeout == 600.0
    assert c.notes == (
        "--rdzv_conf join_timout is not a c10d rendezvous setting; ignored (did you mean join_timeout?)",
    )
    far = build(
        ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--rdzv-conf=foo=1", "--no-python", "true"]
    )
    assert far.notes == ("--rdzv_conf foo is not a c10d rendezvous setting; ignored",)  # no key is near foo
    static = build(["--rdzv-conf=join_timeout=5", "--no-python", "true"])
    assert len(static.notes) == 1 and "not a local rendezvous setting" in static.notes[0]


def test_etcd_v2_runs_on_our_etcd_backend_with_a_note():
    c = build(["--nnodes=2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=h:2379", "--no-python", "true"])
    assert c.rdzv_backend == "etcd" and c.rendezvous.cluster.endpoints == (("h", 2379),)
    assert len(c.notes) == 1 and "etcd-v2 runs on the launcher's etcd backend" in c.notes[0]


def test_cpu_counts_follow_the_affinity_mask():
    """torch._utils.cpu_count: sched_getaffinity, not os.cpu_count (taskset, Slurm, Kubernetes pin CPUs)."""
    mask = len(os.sched_getaffinity(0))
    assert parsers.count_cpus() == mask
    assert parsers.parse_nproc("cpu", {}) == mask
    assert parsers.parse_nproc("auto", {"CUDA_VISIBLE_DEVICES": ""}) == mask


def test_xpu_without_xpus_is_one_clear_line():
    pytest.importorskip("torch")
    if parsers.count_xpus():
        pytest.skip("this host has XPUs")
    with pytest.raises(ConfigError, match="--nproc_per_node xpu: torch sees no XPU here"):
        parsers.parse_nproc("xpu", {})


def test_unknown_logs_specs_is_a_usage_error():
    with pytest.raises(ConfigError, match="no torchrun.logs_specs entry point"):
        build(["--logs-specs=DOESNOT_EXIST", "--no-python", "true"])
    assert build(["--logs_specs=default", "--no-python", "true"]).logs_specs is None


def test_unknown_backend_says_where_plugins_come_from():
    with pytest.raises(ConfigError, match="torchrun.handlers entry point"):
        build(["--nnodes=2", "--rdzv-backend=zookeeper", "--no-python", "true"])


def test_duplicate_filters_and_event_log_handler():
    c = build(
        [
            "--duplicate-stdout-filters=loss,,acc,step",
            "--duplicate_stderr_filters=Error",
            "--event_log_handler=console",
            "--no-python",
            "true",
        ]
    )
    assert c.stdout_filters == ("loss,acc", "step") and c.stderr_filters == ("Error",) and c.events_on_console
    with pytest.raises(ConfigError, match="--event_log_handler 'syslog'"):
        build(["--event_log_handler=syslog", "--no-python", "true"])


def test_health_check_port_is_said_once():
    c = build(["--no-python", "true"], {"TORCHELASTIC_HEALTH_CHECK_PORT": "9000"})
    assert len(c.notes) == 1 and c.notes[0].startswith("TORCHELASTIC_HEALTH_CHECK_PORT=9000: ignored")


@pytest.mark.parametrize("value,said", [("30", True), ("0", False), ("-1", False), ("", False)])
def test_uninterruptible_state_timeout_is_said_when_it_would_be_on(value, said):
    c = build(["--no-python", "true"], {"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": value})
    assert bool(c.notes) is said and all("not acted on" in n for n in c.notes)


def test_a_handlers_plugin_is_found_without_torch(tmp_path, monkeypatch):
    """The name is looked up in package metadata at config time; the plugin (and torch) load at start."""
    info = tmp_path / "p-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: p\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torchrun.handlers]\nmine = not_imported:get_handler\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    c = build(
        ["--nnodes=2", "--rdzv-backend=mine", "--rdzv-endpoint=h:1", "--rdzv-conf=rank=1", "--no-python", "true"],
        {"TORCH_ELASTIC_WORKER_IDENTICAL": "1"},
    )
    assert c.rdzv_backend == "torch" and c.rendezvous.name == "mine" and c.rendezvous.identical
    assert dict(c.rendezvous.conf) == {"rank": "1"} and c.rendezvous.endpoint == "h:1"


def test_an_unknown_keys_value_is_never_echoed():
    """A mistyped key may hold a secret (`passwd=...`): the note names the key only."""
    c = build(
        [
            "--nnodes=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=h:1",
            "--rdzv-conf=passwd=hunter2",
            "--no-python",
            "true",
        ]
    )
    assert len(c.notes) == 1 and "hunter2" not in c.notes[0]
    with pytest.raises(ConfigError, match="would show in ps"):
        build(
            [
                "--nnodes=2",
                "--rdzv-backend=etcd",
                "--rdzv-endpoint=h:1",
                "--rdzv-conf=password=x",
                "--no-python",
                "true",
            ]
        )


def test_c10d_on_port_0_is_one_node_as_torchrun_hosts_it():
    """torchrun's --standalone is c10d on localhost:0: a store on a free port, so no other node joins."""
    args = ["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-conf=join_timeout=5"]
    c = build([*args, "--no-python", "true"])
    assert (c.rdzv_backend, c.min_nodes, c.max_nodes) == ("local", 1, 1)
    assert len(c.notes) == 1 and "as --standalone" in c.notes[0]
    with pytest.raises(ConfigError, match="give a fixed port"):
        build(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--no-python", "true"])


def test_a_python_worker_exits_quickly_unless_finalize_is_asked():
    """--worker_exit quick (default): `python -u …/launcher/agent/worker_exit.py` before the script or `-m
    MODULE`; finalize: torchrun's `python -u SCRIPT`; a --no_python command is run as given."""
    py = cfg._sys_executable()
    assert build([__file__, "x"]).program == (py, "-u", cfg.QUICK_EXIT, __file__)
    assert build(["-m", "json.tool"]).program == (py, "-u", cfg.QUICK_EXIT, "-m", "json.tool")
    assert build(["--worker_exit", "finalize", __file__]).program == (py, "-u", __file__)
    assert build([__file__], {"PET_WORKER_EXIT": "finalize"}).program == (py, "-u", __file__)
    assert build(["--worker-exit", "finalize", "-m", "json.tool"]).program == (py, "-u", "-m", "json.tool")
    assert build(["--no-python", "true"]).program == ("true",)
    with pytest.raises(ConfigError, match="--worker_exit 'fast' is not a mode; use one of quick, finalize"):
        build(["--worker_exit", "fast", __file__])
