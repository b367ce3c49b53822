"""--help lists every subcommand with one line, and every subcommand has its own help."""

from __future__ import annotations

import pytest


def test_help_lists_every_subcommand_with_one_line(launch):
    r = launch.run("--help")
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("Subcommands:")[1]
    for name in ("check", "bench allreduce", "store"):
        assert any(line.strip().startswith(name + " ") for line in section.splitlines()), (name, section)


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--help"],
        ["bench", "-h"],
        ["bench", "allreduce", "--help"],
        ["bench", "allreduce", "-h"],
        ["check", "--help"],
        ["check", "-h"],
        ["store", "--help"],
        ["store", "-h"],
        ["status", "-h"],
        ["report", "-h"],
    ],
    ids=" ".join,
)
def test_every_subcommand_has_its_own_help(launch, args):
    r = launch.run(*args)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "usage" in r.stdout.lower(), r.stdout
    if args[1] != "allreduce" and args[0] == "bench":
        assert "allreduce" in r.stdout
