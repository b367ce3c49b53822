"""Each flag value parsed once where it enters: endpoints, ports, seconds, --nnodes, --nproc_per_node,
--rdzv_conf, --redirects/--tee, rank and GPU lists, signals, preload modules, fractions. A bad
value is a ConfigError whose one line names the flag and the fix."""

from __future__ import annotations

import signal

import pytest

from launcher.config import JOIN_TOKEN_ENV, read_join_token
from launcher.errors import ConfigError
from launcher.parsers import (
    MAX_SECONDS,
    PRELOAD_DEFAULTS,
    count_gpus,
    parse_endpoint,
    parse_fraction,
    parse_gpus,
    parse_kv,
    parse_log_level,
    parse_nnodes,
    parse_nproc,
    parse_port,
    parse_preload,
    parse_ranks,
    parse_seconds,
    parse_signals,
    parse_std,
)
from launcher.spec import STD_NONE


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and text, text
    return text


# ---------------------------------------------------------------------------- endpoints, ports, seconds


@pytest.mark.parametrize(
    "text, default, expect",
    [
        ("node0:29400", None, ("node0", 29400)),
        ("node0", 29400, ("node0", 29400)),
        (" 10.0.0.1:1 ", None, ("10.0.0.1", 1)),
        ("[::1]:29400", None, ("::1", 29400)),
        ("[fe80::1]", 5, ("fe80::1", 5)),
        ("host:0", None, ("host", 0)),
        ("host:65535", None, ("host", 65535)),
    ],
)
def test_an_endpoint_is_host_and_port(text, default, expect):
    assert parse_endpoint(text, default) == expect


@pytest.mark.parametrize(
    "text, default, needle",
    [
        ("node0", None, "needs a port (e.g. node0:29400)"),
        ("a:b:c", None, "is not host:port"),
        ("host:65536", None, "is not a port number (0-65535)"),
        ("host:", None, "is not host:port"),
        ("", 1, "is not host:port"),
        ("two words:1", None, "is not host:port"),
    ],
)
def test_a_bad_endpoint_names_the_flag_and_an_example(text, default, needle):
    with pytest.raises(ConfigError) as e:
        parse_endpoint(text, default, flag="--rdzv_endpoint")
    assert needle in one_line(e) and "--rdzv_endpoint" in str(e.value)


@pytest.mark.parametrize("text", ["-1", "65536", "x", "", None, "1.5"])
def test_a_port_is_0_to_65535(text):
    with pytest.raises(ConfigError, match="--master_port"):
        parse_port(text)


@pytest.mark.parametrize("text, expect", [("0", 0), ("29500", 29500), (80, 80)])
def test_a_port_parses(text, expect):
    assert parse_port(text) == expect


@pytest.mark.parametrize("value, expect", [("0", 0.0), ("1.5", 1.5), (30, 30.0), ("1e6", MAX_SECONDS)])
def test_seconds_parse(value, expect):
    assert parse_seconds(value, "--x") == expect


@pytest.mark.parametrize(
    "value, needle",
    [
        ("nan", "must be at least 0"),
        ("-1", "must be at least 0"),
        ("inf", "must be at most"),
        ("1e400", "must be at most"),
        ("soon", "is not a number of seconds"),
        (None, "is not a number of seconds"),
    ],
)
def test_seconds_out_of_range_or_not_numbers_are_refused(value, needle):
    with pytest.raises(ConfigError) as e:
        parse_seconds(value, "--shutdown_timeout")
    assert needle in one_line(e) and str(e.value).startswith("--shutdown_timeout")


def test_seconds_honour_a_minimum():
    assert parse_seconds("1", "--x", minimum=1) == 1.0
    with pytest.raises(ConfigError, match="must be at least 1"):
        parse_seconds("0.5", "--x", minimum=1)


# ---------------------------------------------------------------------------- --nnodes, --nproc_per_node


@pytest.mark.parametrize("text, expect", [("2", (2, 2)), ("1:4", (1, 4)), (" 3:3 ", (3, 3))])
def test_nnodes_is_n_or_min_max(text, expect):
    assert parse_nnodes(text) == expect


@pytest.mark.parametrize(
    "text, needle",
    [("0", "0 < MIN <= MAX"), ("4:2", "0 < MIN <= MAX"), ("1:2:3", "is not N or MIN:MAX"), ("x", "is not N")],
)
def test_bad_nnodes(text, needle):
    with pytest.raises(ConfigError) as e:
        parse_nnodes(text)
    assert needle in one_line(e)


@pytest.mark.parametrize(
    "visible, expect", [("0,1,2", 3), ("", 0), ("0,-1,2", 1), ("-1", 0), ("GPU-a,GPU-b", 2), (" 3 , 4 ", 2)]
)
def test_gpus_counted_from_cuda_visible_devices_up_to_the_first_invalid_id(visible, expect):
    assert count_gpus({"CUDA_VISIBLE_DEVICES": visible}) == expect


def test_nproc_is_a_number_or_counted():
    assert parse_nproc("4", {}) == 4
    assert parse_nproc("gpu", {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert parse_nproc("auto", {"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert parse_nproc("AUTO", {"CUDA_VISIBLE_DEVICES": ""}) >= 1  # no GPU: the CPU count
    assert parse_nproc("cpu", {}) >= 1


@pytest.mark.parametrize(
    "text, env, needle",
    [
        ("0", {}, "must be at least 1"),
        ("two", {}, "is not a number, cpu, gpu, xpu or auto"),
        ("gpu", {"CUDA_VISIBLE_DEVICES": ""}, "no GPU found; pass a number, cpu or auto"),
    ],
)
def test_bad_nproc(text, env, needle):
    with pytest.raises(ConfigError) as e:
        parse_nproc(text, env)
    assert needle in one_line(e)


# ---------------------------------------------------------------------------- --rdzv_conf and the join token


def test_rdzv_conf_is_comma_separated_key_value():
    assert parse_kv("join_timeout=60, last_call_timeout = 1,,") == {"join_timeout": "60", "last_call_timeout": "1"}
    assert parse_kv("") == {}
    assert parse_kv("a=") == {"a": ""}
    assert parse_kv("a=1,a=2") == {"a": "2"}  # the last one wins, as in torchrun


@pytest.mark.parametrize("text", ["=1", "novalue", "a=1,b"])
def test_rdzv_conf_items_must_be_key_value(text):
    with pytest.raises(ConfigError, match=r"is not key=value \(e.g. --rdzv_conf join_timeout=60\)"):
        parse_kv(text)


def test_the_join_token_comes_from_a_file_or_the_environment_never_the_command_line(tmp_path):
    assert read_join_token({}, {}) is None
    assert read_join_token({}, {JOIN_TOKEN_ENV: "s3cret"}) == "s3cret"
    token = tmp_path / "token"
    token.write_text("from-file\n")
    conf = {"join_token_file": str(token), "join_timeout": "5"}
    assert read_join_token(conf, {JOIN_TOKEN_ENV: "env"}) == "from-file"
    assert conf == {"join_timeout": "5"}  # taken out: the backend never sees it
    with pytest.raises(ConfigError, match="would show in ps"):
        read_join_token({"join_token": "x"}, {})
    token.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        read_join_token({"join_token_file": str(token)}, {})
    with pytest.raises(ConfigError, match="No such file"):
        read_join_token({"join_token_file": str(tmp_path / "missing")}, {})


# ---------------------------------------------------------------------------- --redirects/--tee, ranks, GPUs


def test_std_is_one_value_or_a_per_rank_map():
    assert parse_std("3", "--tee").default == 3
    assert parse_std("", "--tee").default == 0
    mapped = parse_std("0:1,12:3", "--redirects")
    assert mapped.default == STD_NONE and dict(mapped.per_rank) == {0: 1, 12: 3}


@pytest.mark.parametrize("text", ["4", "0:4", "a", "0:1,", "-1"])
def test_bad_std(text):
    with pytest.raises(ConfigError, match="is not 0-3 or a map like 0:1,1:3"):
        parse_std(text, "--redirects")


def test_ranks_filter():
    assert parse_ranks(None) is None and parse_ranks(" ") is None
    assert parse_ranks("0, 3,3") == frozenset({0, 3})
    with pytest.raises(ConfigError, match="has a negative rank"):
        parse_ranks("-1")
    with pytest.raises(ConfigError, match="is not a list of ranks"):
        parse_ranks("0,x")


def test_gpus_are_unique_ids_or_uuids():
    assert parse_gpus(None) == () and parse_gpus("") == ()
    assert parse_gpus("2, 3") == ("2", "3")
    assert parse_gpus("GPU-8a1b,MIG-1-2") == ("GPU-8a1b", "MIG-1-2")
    with pytest.raises(ConfigError, match="names a GPU twice"):
        parse_gpus("1,1")
    with pytest.raises(ConfigError, match="is not a list of GPU ids"):
        parse_gpus("1,,2")


# ---------------------------------------------------------------------------- signals, preload, levels, fractions


def test_signals_by_name_short_name_or_number_once_each():
    assert parse_signals("SIGTERM,usr1,10,SIGUSR1") == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_signals("") == ()


@pytest.mark.parametrize(
    "text, needle", [("SIGKILL", "cannot be handled"), ("STOP", "cannot be handled"), ("SIGNOPE", "not a signal")]
)
def test_bad_signals(text, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_signals(text)


def test_preload_modules():
    assert parse_preload(False, None) is None
    assert parse_preload(True, None) == PRELOAD_DEFAULTS
    more = parse_preload(False, "transformers, mypkg.model")  # implies --preload
    assert more == (*PRELOAD_DEFAULTS, "transformers", "mypkg.model")
    assert parse_preload(False, "-torch._dynamo") == PRELOAD_DEFAULTS[:-1]  # a job without torch.compile
    assert parse_preload(False, "-torch, json") == ("json",)  # torch and all under it: a job without torch
    with pytest.raises(ConfigError, match="is not a module name"):
        parse_preload(True, "my-pkg")
    with pytest.raises(ConfigError, match="is not a module name"):
        parse_preload(True, "-my-pkg")
    with pytest.raises(ConfigError, match="^--preload_modules -numpy drops nothing; the modules --preload imports"):
        parse_preload(True, "-numpy")


def test_log_level_and_fraction():
    assert parse_log_level(None) == "info" and parse_log_level(" DEBUG ") == "debug"
    with pytest.raises(ConfigError, match="is not one of debug, info, warning, error"):
        parse_log_level("verbose")
    assert parse_fraction("0", "--f") == 0.0 and parse_fraction("0.25", "--f") == 0.25
    for bad in ("1", "-0.1", "nan"):
        with pytest.raises(ConfigError, match="must be from 0"):
            parse_fraction(bad, "--f")
