"""--preload: a forked worker exits as `python` does, never deadlocks in its DDP model's teardown, and its
exit is neither a hang nor able to hold the job.

A forked worker runs the exit `python` runs (threads joined, atexit handlers, the script's globals freed,
stdio flushed), then leaves with `os._exit` instead of finalising the heap the zygote preloaded. Its
default process group lives as long as in a spawned worker: pytorch/examples' DDP tutorial (destroy
the group, return from `main`, which frees the model) deadlocked in 9 of 21 forked runs when the group
died with the model (gloo's destructor joins a thread that waits for the GIL).
"""

from __future__ import annotations

import pytest
from support.paths import worker

JOB = """
import atexit, sys, threading, time

out = open(sys.argv[1], "w")
out.write("written, never closed\\n")  # flushed only when the interpreter frees the file at exit


class Noisy:
    def __del__(self):
        print("__del__ of a global ran", flush=True)


noisy = Noisy()
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("non-daemon thread finished", flush=True))).start()
print("script returned", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers_from", ["spawn", "preload"], indirect=True)
def test_an_exit_runs_what_python_runs_at_exit(tmp_path, launch):
    (tmp_path / "job.py").write_text(JOB)
    r = launch.run("--nproc_per_node", "1", str(tmp_path / "job.py"), str(tmp_path / "out.txt"), timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.removeprefix("[rank0]: ") for line in r.stdout.splitlines()]
    # python's order: the script, its non-daemon threads, atexit, then its globals are freed
    assert lines == ["script returned", "non-daemon thread finished", "atexit ran", "__del__ of a global ran"], r.stdout
    assert (tmp_path / "out.txt").read_text() == "written, never closed\n"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers_from", ["preload"], indirect=True)
def test_a_ddp_model_freed_at_the_end_of_main_never_holds_the_job(launch):
    # Forked only: a spawned worker of this job meets torch's own teardown race now and then (its
    # group is freed while the interpreter finalises: SIGABRT, pytorch#190489), which a forked one skips.
    for attempt in range(3):  # the deadlock was a race (9 of 21 runs); the group's lifetime is not
        r = launch.run("--nproc_per_node", "2", worker("ddp_free_model.py"), timeout=60)
        assert r.returncode == 0, (attempt, r.stderr[-2000:])
        for rank in (0, 1):
            assert f"[rank{rank}]: group outlived its model: True" in r.stdout, (attempt, r.stdout)
            assert f"[rank{rank}]: done" in r.stdout, (attempt, r.stdout)


SLOW_ATEXIT = """
import atexit, os, threading, time

if os.environ["RANK"] == os.environ.get("STUCK_RANK", "-1"):
    atexit.register(threading.Event().wait)  # never returns: a teardown stuck for ever
else:
    atexit.register(time.sleep, float(os.environ.get("ATEXIT_SECONDS", "0")))  # silent, longer than the hang timeout
print("done", flush=True)
"""


@pytest.mark.timeout(90)
def test_a_forked_workers_exit_is_not_a_hang(tmp_path, launch):
    (tmp_path / "job.py").write_text(SLOW_ATEXIT)
    r = launch.run(
        "--preload", "--hang_timeout", "1", "--nproc_per_node", "2", str(tmp_path / "job.py"),
        env={"ATEXIT_SECONDS": "3"}, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "hung" not in r.stderr and "made no progress" not in r.stderr, r.stderr[-2000:]


@pytest.mark.timeout(90)
def test_a_forked_worker_stuck_in_its_exit_is_ended_once_its_peers_exited_0(tmp_path, launch):
    (tmp_path / "job.py").write_text(SLOW_ATEXIT)
    r = launch.run("--preload", "--nproc_per_node", "2", str(tmp_path / "job.py"), env={"STUCK_RANK": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        "rank 1's code returned 0 and every other rank exited 0, but it has not exited in 10 s "
        "(stuck in its teardown); ending it and counting it a success"
    ) in r.stderr, r.stderr[-2000:]
