"""A worker's traceback on the console (agent/logs.py): the collateral of another rank's failure is one
line after the root cause, its whole traceback in a file; any other traceback is printed whole. Real
pipes through a real LogRouter; the supervisor's word (`failed_first`) is given by the test."""

from __future__ import annotations

import io
import os

from support.processes import wait_for

from launcher.agent.logs import LogRouter

TRACE = (
    b"[rank0]: Traceback (most recent call last):\n"
    b'[rank0]:   File "train.py", line 170, in <module>\n'
    b"[rank0]:     loss.backward()\n"
    b"[rank0]: RuntimeError: Read error [127.0.0.1]:56719: Connection reset by peer\n"
)


def run(tmp_path, text: bytes, root=None, end=True, before: bytes = b"") -> tuple[str, LogRouter]:
    """`before`, then `text` on rank 0's stderr (then its end, with `end`), `root` named in between."""
    r, w = os.pipe()
    console, router = io.BytesIO(), LogRouter()
    try:
        with os.fdopen(r, "rb", buffering=0) as pipe:
            s = router.add(pipe, "[rank0]: ", console, None, rank=0, name="stderr", keep=str(tmp_path / "tb.log"))
            os.write(w, before + text)
            if root:
                router.failed_first(*root)
            if not end:  # a worker still running: printed whole once it has been quiet a moment
                wait_for(lambda: b"RuntimeError" in console.getvalue(), timeout=5, what="the traceback")
            os.close(w)
            assert router.drain([s], timeout=5.0)
            return console.getvalue().decode(), router
    finally:
        router.close()


def test_a_collateral_traceback_is_one_line_naming_the_root_cause_and_the_file(tmp_path):
    out, _ = run(tmp_path, TRACE, root=(1, "killed by SIGKILL"), before=b"epoch 2 done\n")
    where = tmp_path / "tb.log"
    assert out.splitlines() == [
        "[rank0]: epoch 2 done",
        "[rank0]: RuntimeError: Read error [127.0.0.1]:56719: Connection reset by peer  (after rank 1 killed "
        f"by SIGKILL; the whole traceback is in {where})",
    ]
    assert where.read_bytes() == TRACE  # whole, as it came


def test_the_root_causes_own_traceback_and_an_unjudged_one_are_printed_whole(tmp_path):
    mine, _ = run(tmp_path, TRACE, root=(0, "exited with code 1"))
    assert mine.count("\n") == 4 and "Traceback" in mine
    unjudged, _ = run(tmp_path, TRACE)  # nobody named a failure within AFTER_EXIT of its end
    assert unjudged.count("\n") == 4 and "Traceback" in unjudged
    assert not (tmp_path / "tb.log").exists()


def test_a_running_workers_traceback_is_printed_whole_once_quiet(tmp_path):
    out, _ = run(tmp_path, TRACE, root=(1, "killed by SIGKILL"), end=False)
    assert out.count("\n") == 4 and "Traceback" in out


class NextRoundMeanwhile(LogRouter):
    """The supervisor starts the next round (`new_round`) just as the pump releases a judged traceback."""

    def _release(self, s, whole, *args, **kwargs):
        self.new_round()
        super()._release(s, whole, *args, **kwargs)


def test_a_round_started_while_a_traceback_is_judged_loses_no_output(tmp_path):
    console, router = io.BytesIO(), NextRoundMeanwhile()
    try:
        r, w = os.pipe()
        with os.fdopen(r, "rb", buffering=0) as pipe:
            s = router.add(pipe, "[rank0]: ", console, None, rank=0, name="stderr", keep=str(tmp_path / "tb.log"))
            os.write(w, TRACE)
            os.close(w)
            router.failed_first(1, "exited with code 1")
            assert router.drain([s], timeout=5.0)
        r, w = os.pipe()  # the next round's worker: its lines still reach the console
        with os.fdopen(r, "rb", buffering=0) as pipe:
            s = router.add(pipe, "[rank0]: ", console, None, rank=0, name="stdout")
            os.write(w, b"joined restart=1\n")
            os.close(w)
            assert router.drain([s], timeout=5.0)
    finally:
        router.close()
    assert console.getvalue().decode().splitlines() == [
        "[rank0]: RuntimeError: Read error [127.0.0.1]:56719: Connection reset by peer  (after rank 1 exited "
        f"with code 1; the whole traceback is in {tmp_path / 'tb.log'})",
        "[rank0]: joined restart=1",
    ]
