"""The plain reading of a launch line (`cli.flags.quick`, no click) against click's: any line it reads,
it reads as click does, word for word; every other line it leaves to click."""

from __future__ import annotations

import os

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import commands as cli
from launcher.cli.flags import LAUNCH, SUBCOMMAND_WORDS, quick


def by_click(args: list[str], env: dict[str, str]) -> dict:
    """What click hands the launch command for `args`, with `env` as the whole environment."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return dict(cli.command.make_context("launcher", list(args)).params)
    finally:
        os.environ.clear()
        os.environ.update(saved)


PLAIN = [
    ["train.py"],
    ["--nproc_per_node", "8", "train.py", "--lr", "0.1"],
    ["--nproc-per-node=4", "--nnodes", "1:2", "-m", "pkg.train", "--", "x"],
    ["--no_python", "--run-path", "--standalone", "./run.sh", "-m"],
    ["--preload", "--no-live", "-q", "-r", "3", "-t", "0:1", "--log_dir", "", "train.py"],
    ["--no_preload", "--live", "--rdzv-conf=a=1,b=-2", "--master_port=", "t.py"],
    ["--nproc_per_node", "2", "--nproc_per_node", "3", "t.py", "--nproc_per_node", "9"],
    ["--module", "--use-env", "--append-local-rank", "--virtual_local_rank", "json.tool"],
]


@pytest.mark.parametrize("args", PLAIN)
def test_a_plain_line_is_read_as_click_reads_it(args):
    assert quick(args, {}) == by_click(args, {})


# Lines click must read: help, version, a subcommand, an abbreviation, glued short options, a value that
# looks like an option, a flag given a value, `--`, no script, an environment default, a Slurm step.
LEFT_TO_CLICK = [
    ([], {}),
    (["--help"], {}),
    (["-h", "t.py"], {}),
    (["--version"], {}),
    (["status", "--rdzv_id", "x"], {}),
    (["check"], {}),
    (["bench", "allreduce"], {}),
    (["--nproc_per", "2", "t.py"], {}),
    (["-r3", "t.py"], {}),
    (["-mq", "pkg"], {}),
    (["--max_restarts", "-1", "t.py"], {}),
    (["--standalone=1", "t.py"], {}),
    (["--", "t.py"], {}),
    (["--nproc_per_node"], {}),
    (["--nproc_per_node", "2"], {}),
    (["-", "x"], {}),
    (["t.py"], {"PET_NPROC_PER_NODE": "2"}),
    (["t.py"], {"LAUNCHER_LOG_LEVEL": "debug"}),
    (["t.py"], {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"}),
]


@pytest.mark.parametrize("args,env", LEFT_TO_CLICK)
def test_every_other_line_is_left_to_click(args, env):
    assert quick(args, env) is None


def test_the_subcommand_words_are_the_subcommands():
    assert SUBCOMMAND_WORDS == set(cli.SUBCOMMANDS) | {words[0] for words in cli.WORKLOADS}


def test_the_table_is_what_click_declares():
    options = [p for p in cli.command.params if isinstance(p, click.Option) and p.name != "version"]
    assert [p.name for p in options] == [f.dest for f in LAUNCH]
    for p, f in zip(options, LAUNCH):
        assert set(p.opts + p.secondary_opts) == set(f.spellings()), f.name
        assert (p.envvar, p.is_flag) == (f.envvar, f.is_flag or f.switch), f.name


SPELLINGS = sorted({s for f in LAUNCH for s in f.spellings()})
WORDS = st.sampled_from([*SPELLINGS, "--help", "--nproc", "--", "-", "-r3", "2", "", "-1", "a=b", "x.py", "--tee=1"])


@settings(max_examples=300, deadline=None)
@given(st.lists(WORDS, max_size=8))
def test_any_line_it_reads_is_read_as_click_reads_it(args):
    mine = quick(args, {})
    if mine is not None:
        assert mine == by_click(args, {})
