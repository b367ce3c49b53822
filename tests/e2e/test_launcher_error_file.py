"""The launcher's own TORCHELASTIC_ERROR_FILE: the root cause's error file is copied to it; none is
written without one; an unwritable one is one line and keeps the exit code."""

from __future__ import annotations

import json

import pytest
from support.paths import worker

TORCH_RECORD_WORKER = """
import os, sys, time
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    mark = os.path.join(os.environ["MARK_DIR"], os.environ["RANK"])
    with open(mark + ".part", "w") as f:
        f.write(os.environ["TORCHELASTIC_ERROR_FILE"])
    os.replace(mark + ".part", mark)
    if os.environ["RANK"] == "1":
        # rank 0 may still be importing on a busy host: the group's stop would end it before its mark
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(os.environ["MARK_DIR"], "0")) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise ValueError("bad learning rate -1")
    time.sleep(30)

main()
"""


@pytest.mark.timeout(90)
def test_root_cause_error_file_is_copied_to_the_launchers_own(launch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCH_RECORD_WORKER)
    parent = tmp_path / "scheduler" / "error.json"
    parent.parent.mkdir()
    parent.write_text("left over from an earlier run")
    r = launch.run(
        "--nproc_per_node",
        "2",
        str(script),
        timeout=80,
        env={"MARK_DIR": str(tmp_path), "TORCHELASTIC_ERROR_FILE": str(parent)},
    )
    assert r.returncode == 1, r.stderr
    own = [(tmp_path / str(rank)).read_text() for rank in (0, 1)]
    assert str(parent) not in own and own[0] != own[1]  # every worker still has its own file
    data = json.loads(parent.read_text())
    assert data["message"]["message"] == "ValueError: bad learning rate -1"
    assert data["message"]["errorCode"] == 1  # torchrun's dump_error_file sets the exit code
    assert "in main" in data["message"]["extraInfo"]["py_callstack"]
    assert (
        data["message"]["extraInfo"]["timestamp"]
        == json.loads(open(own[1]).read())["message"]["extraInfo"]["timestamp"]
    )


def test_no_error_file_is_written_without_a_root_cause_error_file(launch, tmp_path):
    parent = tmp_path / "error.json"
    r = launch.run(
        "--nproc_per_node", "2", worker("exit_code.py"), env={"FAIL_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(parent)}
    )
    assert r.returncode == 3, r.stderr
    assert not parent.exists()  # as torchrun: nothing to copy
    r = launch.run("--nproc_per_node", "1", worker("echo_args.py"), env={"TORCHELASTIC_ERROR_FILE": str(parent)})
    assert r.returncode == 0 and not parent.exists(), r.stderr


def test_an_unwritable_launcher_error_file_is_one_line_and_keeps_the_exit_code(launch, tmp_path):
    dest = tmp_path / "no-such-folder" / "error.json"
    r = launch.run("--nproc_per_node", "1", worker("record_error.py"), env={"TORCHELASTIC_ERROR_FILE": str(dest)})
    assert r.returncode == 1, r.stderr
    assert "launcher/cli/run.py" not in r.stderr and "FileNotFoundError" not in r.stderr, (
        r.stderr
    )  # no traceback of ours
    assert sum(f"TORCHELASTIC_ERROR_FILE={dest}" in line for line in r.stderr.splitlines()) == 1, r.stderr
