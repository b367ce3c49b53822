"""The restart policy, health gate and quarantine as the supervisor applies them, in-process: the
fake workers, clock and rendezvous of tests/support/supervisor_rig.py's `Rig`, a dict for the job's store,
and a fake NVML. Nothing sleeps; the backoff is watched on the fake clock."""

from __future__ import annotations

import json
import re
import signal
import threading
from types import SimpleNamespace

from support.supervisor_rig import Rig
from test_health_gate import FakeGpu, FakeNvml

from launcher.agent.signals import SignalReceived
from launcher.errors import RendezvousClosedError
from launcher.policy.governor import Governor
from launcher.policy.health import HealthGate
from launcher.policy.quarantine import QuarantineBook, make_record
from launcher.rendezvous.api import Cause, MembershipChanged
from launcher.rendezvous.records import decode_verdict, encode_verdict
from launcher.spec import GroupState, RestartPolicy, Verdict
from launcher.telemetry.summary import summary_lines


class DictStore:
    """The four store calls a quarantine book makes, over a dict."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def add(self, key, amount):
        self.data[key] = str(int(self.data.get(key, b"0")) + amount).encode()
        return int(self.data[key])

    def set(self, key, value):
        self.data[key] = value

    def get(self, key):
        return self.data.get(key)

    def multi_get(self, keys):
        return [self.data.get(k) for k in keys]


def book(store: DictStore) -> QuarantineBook:
    return QuarantineBook(store, "quarantine", lambda i: f"quarantine{i}")


def with_governor(rig: Rig, gate: HealthGate | None = None, store: DictStore | None = None) -> DictStore:
    """A governor of a node in a multi-node job, with the job's quarantine records in `store`."""
    store = store or DictStore()
    policy = rig.config.restart_policy
    rig.sup.governor = Governor(policy, "testhost", "unit", gate=gate, book=lambda: book(store), multi_node=True)
    return store


def fail(proc, code: int = 1, error: str = "", step: int | None = None) -> None:
    """End a fake worker as a real one would: its error file and last progress written first."""
    if error:
        with open(proc.env["TORCHELASTIC_ERROR_FILE"], "w") as f:
            json.dump({"message": error}, f)
    if step is not None:
        with open(proc.env["LAUNCHER_PROGRESS_FILE"], "w") as f:
            f.write(f"{step:20d}\n")
    proc.exit(code)


def failed(rig: Rig) -> None:
    rig.turn(lambda: rig.sup.state is GroupState.FAILED, "FAILED")


def test_quick_failures_back_off_on_the_clock_the_first_restart_immediate(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=5, restart_policy="backoff=2,backoff_max=3", quarantine="window=0")
    rig.start()
    fail(rig.spawn.procs[0])
    rig.running(2)  # the first restart: at once
    assert "backoff" not in rig.kinds()
    fail(rig.spawn.procs[1])
    rig.turn(lambda: "backoff" in rig.kinds(), "a backoff")
    assert ("backoff", {"delay": 2.0, "quick_failures": 2}) in rig.events
    assert rig.rdzv.watched == [0, 1, 2]  # the formed round is held, heartbeating
    assert rig.sup.snapshot().waiting == "backoff: restarting in 2 s"
    rig.clock.now += 1.9
    rig.sup.step(timeout=0)
    assert len(rig.spawn.procs) == 2 and rig.sup.state is GroupState.RENDEZVOUS
    rig.clock.now += 0.1
    rig.sup.step(timeout=0)
    assert len(rig.spawn.procs) == 3 and rig.sup.state is GroupState.RUNNING
    fail(rig.spawn.procs[2])
    rig.turn(lambda: rig.kinds().count("backoff") == 2, "a second backoff")
    assert rig.events[-1] == ("backoff", {"delay": 3.0, "quick_failures": 3})  # doubled, capped


def test_a_round_that_ends_while_held_is_left_for_the_next(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=5, restart_policy="backoff=5")
    rig.start()
    fail(rig.spawn.procs[0])
    rig.running(2)
    fail(rig.spawn.procs[1])
    rig.turn(lambda: "backoff" in rig.kinds(), "a backoff")
    rig.sup.post(MembershipChanged("a node joined"))
    rig.running(3)  # re-formed at once: the backoff was for the round that ended
    assert rig.rdzv.causes == [Cause.START, Cause.FAILURE, Cause.FAILURE, Cause.MEMBERSHIP]


def test_a_failure_on_another_node_counts_toward_this_nodes_backoff(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=5, restart_policy="backoff=4")
    rig.start()
    for n in (2, 3):
        rig.sup.post(MembershipChanged("rank 3 on h2 exited with code 1", failed=True))
        rig.turn(lambda n=n: len(rig.spawn.procs) == n or "backoff" in rig.kinds(), "a restart")
    assert ("backoff", {"delay": 4.0, "quick_failures": 2}) in rig.events


def test_the_same_error_at_the_same_step_twice_stops_with_do_not_requeue(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=5)
    rig.start()
    fail(rig.spawn.procs[1], error="RuntimeError: loss is NaN", step=700)
    rig.running(4)
    fail(rig.spawn.procs[3], error="RuntimeError: loss is NaN", step=700)
    failed(rig)
    result = rig.sup.result()
    assert result.exit_code == 70 and rig.rdzv.causes == [Cause.START, Cause.FAILURE]  # no second restart
    why = "rank 1 failed twice with the same error at step 700: RuntimeError: loss is NaN"
    assert ("policy_stop", {"stop": "deterministic", "reason": why, "host": "testhost"}) in rig.events
    lines = summary_lines(result)
    assert lines[0] == "job failed (exit code 70: do not requeue) after 1 restart(s)"
    assert lines[1] == f"reason: not restarting: {why}"


def test_one_node_alone_is_never_quarantined_for_failures(tmp_path):
    """Its failures are the job's: the budget, the deterministic and the no-progress rules judge them."""
    rig = Rig(tmp_path, nproc=1, max_restarts=4, restart_policy="quick=0", quarantine="after=1,window=1")
    rig.start()
    for n in range(1, 5):
        fail(rig.spawn.procs[n - 1], error=f"error {n}")
        rig.running(n + 1)
    assert rig.sup.state is GroupState.RUNNING


def test_the_same_error_on_its_last_stderr_line_counts_too(tmp_path):
    """No error file: the worker's last stderr line (its exception) is the error compared."""
    rig = Rig(tmp_path, nproc=1, max_restarts=5)
    rig.start()
    for n in (1, 2):
        out = SimpleNamespace(name="stdout", last_line=f"epoch {n} began", last_at=2.0, done=threading.Event())
        err = SimpleNamespace(name="stderr", last_line="ValueError: bad shard 3", last_at=1.0, done=threading.Event())
        err.done.set()  # its pipe read to the end
        rig.sup.members[0].streams = [out, err]  # stdout's last line is newer: never the one compared
        fail(rig.spawn.procs[n - 1])
        rig.turn(lambda n=n: len(rig.spawn.procs) > n or rig.sup.state is GroupState.FAILED, "a restart or a stop")
    assert rig.sup.result().exit_code == 70


def test_rounds_in_a_row_that_do_not_pass_the_best_step_stop_the_job(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=9, restart_policy="no_progress=2,quick=0", quarantine="window=0")
    rig.start()
    fail(rig.spawn.procs[0], error="NCCL timeout 1", step=100)
    rig.running(2)
    fail(rig.spawn.procs[1], error="NCCL timeout 2", step=60)
    rig.running(3)
    fail(rig.spawn.procs[2], error="NCCL timeout 3", step=90)
    failed(rig)
    result = rig.sup.result()
    assert result.exit_code == 70
    assert result.message == "not restarting: 2 restarts in a row made no progress past step 100 " + (
        "(--restart_policy no_progress=2)"
    )


def test_varied_failures_that_spend_the_budget_ask_for_a_requeue(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=1)
    rig.start()
    fail(rig.spawn.procs[0], code=3, error="OSError: disk quota")
    rig.running(2)
    fail(rig.spawn.procs[1], code=3, error="NCCL error")
    failed(rig)
    assert rig.sup.result().exit_code == 75


def test_a_node_failing_repeatedly_is_quarantined_and_recorded(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=9, quarantine="after=2,window=3,cooldown=600")
    store = with_governor(rig)
    rig.start()
    fail(rig.spawn.procs[0], error="CUDA error: an illegal memory access")
    rig.running(2)
    fail(rig.spawn.procs[1], error="CUDA error: unspecified launch failure")
    failed(rig)
    result = rig.sup.result()
    assert result.exit_code == 69 and rig.rdzv.causes == [Cause.START, Cause.FAILURE]
    why = "its workers failed in 2 of its last 2 rounds (--quarantine after=2,window=3)"
    assert result.message == f"testhost is quarantined: {why}"
    [record] = book(store).all()
    assert (record.host, record.why, record.until - record.at) == ("testhost", why, 600)
    lines = summary_lines(result)
    assert lines[0] == "job failed (exit code 69: quarantined: drain this node) after 1 restart(s)"
    assert lines[2] == f"quarantined: testhost ({why})"


def test_a_failing_health_check_keeps_the_node_out_of_its_first_round(tmp_path):
    rig = Rig(tmp_path, nproc=1)
    store = with_governor(rig, HealthGate(None, nvml=lambda: FakeNvml(FakeGpu("GPU-a", ecc=1))))
    rig.sup.begin_round(Cause.START)
    failed(rig)
    result = rig.sup.result()
    assert result.exit_code == 69 and rig.rdzv.causes == [] and rig.spawn.procs == []  # it never joined
    why = "health check failed: GPU 0 has 1 uncorrected ECC error(s) since the driver loaded"
    assert result.message == f"testhost is quarantined: {why}"
    assert [r.why for r in book(store).all()] == [why]


def test_the_health_check_runs_before_each_restart_with_the_last_workers(tmp_path):
    rig = Rig(tmp_path, nproc=2, max_restarts=3)
    gpu = FakeGpu("GPU-a")
    with_governor(rig, HealthGate(None, nvml=lambda: FakeNvml(gpu), memory_wait=0, sleep=lambda s: None))
    rig.start()
    last = [p.pid for p in rig.spawn.procs]
    gpu.pids = [last[1]]  # a worker of the last round still holds GPU memory
    fail(rig.spawn.procs[0])
    failed(rig)
    assert rig.rdzv.causes == [Cause.START]  # kept out before it asked for the restart
    held = f"GPU 0 still holds the memory of the last workers (pid {last[1]})"
    assert rig.sup.result().message.startswith(f"testhost is quarantined: health check failed: {held}")


def test_a_node_started_again_on_a_quarantined_host_refuses_to_join(tmp_path):
    rig = Rig(tmp_path, nproc=1)
    store = DictStore()
    book(store).add(make_record("otherhost", "health check failed: x", 600))
    book(store).add(make_record("testhost", "its workers failed in 3 of its last 5 rounds", 600))
    with_governor(rig, store=store)
    rig.sup.begin_round(Cause.START)
    failed(rig)
    result = rig.sup.result()
    assert result.exit_code == 69 and rig.rdzv.causes == []
    why = "its workers failed in 3 of its last 5 rounds"
    assert re.fullmatch(rf"testhost is quarantined: (600|59\d) s of its cooldown left, for: {why}", result.message)


def test_a_quarantine_past_its_cooldown_is_no_bar(tmp_path):
    rig = Rig(tmp_path, nproc=1)
    store = DictStore()
    book(store).add(make_record("testhost", "old", 600, now=1.0))
    with_governor(rig, store=store)
    rig.start()
    assert rig.rdzv.causes == [Cause.START]


def test_a_job_closed_by_another_nodes_policy_exits_with_its_code(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=3)
    rig.start()
    verdict = Verdict("h2", "h2:9", 3, 1, 1, 1, "RuntimeError: loss is NaN", code=70)

    def closed(cause, verdict_=None, waiting=None):
        raise RendezvousClosedError("the job was closed: not restarting: rank 3 failed twice", verdict)

    rig.rdzv.next_round = closed
    rig.sup.post(MembershipChanged("closed", closed=True))
    failed(rig)
    assert rig.sup.result().exit_code == 70


def test_the_verdict_carries_the_jobs_code_through_the_store():
    v = Verdict("h2", "h2:9", 3, 1, 1, 1, "RuntimeError: loss is NaN", "/logs/x", code=70)
    assert decode_verdict(encode_verdict(v)) == v


def test_a_signal_during_the_backoff_ends_the_job_at_once(tmp_path):
    rig = Rig(tmp_path, nproc=1, max_restarts=5, restart_policy="backoff=30", quarantine="window=0")
    rig.start()
    fail(rig.spawn.procs[0])
    rig.running(2)
    fail(rig.spawn.procs[1])
    rig.turn(lambda: "backoff" in rig.kinds(), "a backoff")
    rig.sup.post(SignalReceived(signal.SIGTERM))
    failed(rig)
    assert rig.sup.result().exit_code == 143 and len(rig.spawn.procs) == 2  # no worker started after it


def test_malformed_quarantine_records_are_ignored_with_a_warning(caplog):
    store = DictStore()
    book(store).add(make_record("good", "health check failed: x", 600))
    store.data["quarantine"] = b"3"
    store.data["quarantine2"] = b"{not json"
    store.data["quarantine3"] = json.dumps({"host": "h", "why": "w", "at": "soon", "until": 1}).encode()
    assert [r.host for r in book(store).all()] == ["good"]
    assert caplog.text.count("malformed quarantine record") == 2
    record = make_record("h", "first line\nsecond line \x1b[31m", 600)
    assert record.why == "first line"  # one printable line, bounded


def test_a_quarantine_the_store_cannot_record_is_one_warning_line_not_a_traceback(caplog):
    class Broken(DictStore):
        def add(self, key, amount):
            raise ConnectionError("etcd failed mid-request (timed out)")

    governor = Governor(RestartPolicy(), "testhost", "unit", book=lambda: book(Broken()), multi_node=True)
    with caplog.at_level("DEBUG", logger="launcher.policy.governor"):
        governor.quarantine("its workers failed")
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.getMessage() for r in warnings] == [
        "could not record the quarantine in the job's store: etcd failed mid-request (timed out)"
    ]
    assert warnings[0].exc_info is None  # the trace is at debug level only
