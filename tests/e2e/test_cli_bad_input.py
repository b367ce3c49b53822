"""Bad input to the real command line: one line on stderr and exit 2, never a traceback (the
property tests over the same flags run in process: tests/unit/test_bad_flags.py)."""

from __future__ import annotations

import pytest
from support.launcher_runs import assert_one_line_exit_2
from support.paths import worker

SCRIPT = worker("echo_args.py")


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
    assert_one_line_exit_2(launch.run(*args, timeout=60))
