"""torchrun's unambiguous flag prefixes are accepted before the script; an ambiguous prefix or a typo
is one line with a suggestion."""

from __future__ import annotations

import pytest
from support.launcher_runs import assert_one_line_exit_2
from support.paths import worker


@pytest.mark.parametrize(
    "args",
    [
        ["--nproc_per", "2"],
        ["--nproc-per", "2"],
        ["--nproc_per=2"],
        ["--nproc-p=2"],
        ["--nproc_per", "2", "--max_rest", "1", "--role", "r"],
    ],
    ids=" ".join,
)
def test_unambiguous_prefix_before_the_script_is_accepted(launch, args):
    r = launch.run(*args, worker("echo_args.py"), "--nproc_per", "x")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("\n"))[1:] == [f"[rank{n}]: rank={n} args=['--nproc_per', 'x']" for n in (0, 1)], (
        r.stdout
    )


@pytest.mark.parametrize(
    "args, hint",
    [
        (["--no", "2"], "--no_live"),  # ambiguous: --no_python, --node_rank, --no_live ...
        (["--nprocs_per_node", "2"], "--nproc_per_node"),  # a typo, not a prefix
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else a,
)
def test_ambiguous_prefix_or_typo_is_one_line_with_a_suggestion(launch, args, hint):
    r = launch.run(*args, worker("echo_args.py"))
    assert_one_line_exit_2(r)
    assert "Did you mean" in r.stderr and hint in r.stderr, r.stderr
