"""The tests' fixtures; what they are built from lives in tests/support/ (importable as `support`)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time

import pytest
from support.etcd import Member, Members
from support.launcher_runs import Cluster, Launch
from support.rendezvous import serve_store

# pytest rewrites each test module's asserts as it imports it (~10 s of CPU for the suite), in every xdist
# worker, and caches the result only where bytecode may be written: where PYTHONDONTWRITEBYTECODE is set,
# each run rewrote every module five times over. This pytest process writes it (scripts/test.sh has two
# write it before the workers start); what it starts does not.
sys.dont_write_bytecode = False

# A shell without job control starts a background command (`bash scripts/test.sh &`, nohup, a CI
# runner's step) with SIGINT ignored, and an ignored signal stays ignored across exec: every launcher
# and worker the tests start would ignore the Ctrl-C they send (Python, and the launcher with it, keep
# an inherited SIG_IGN, as a background job should). A handler is reset to the default at exec: the
# processes the tests start get a terminal's Ctrl-C however the suite itself was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption(
        "--file-times",
        metavar="PATH",
        help="write each test file's seconds to PATH at the end (tests/file_times.txt orders xdist's hand-out)",
    )


def pytest_configure(config):
    """Under xdist (scripts/test.sh), `--dist loadfile` hands out the longest files first
    (support/schedule.py); `--file-times` writes what each file took."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    from support import schedule

    config.pluginmanager.register(schedule.Scheduling(), "longest-files-first")
    if config.getoption("--file-times") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(schedule.FileTimes(config.getoption("--file-times")), "file-times")


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_pytests_tree(tmp_path_factory):
    """TMPDIR for this xdist worker and everything it starts, inside pytest's own temporary tree (which
    keeps the last three runs): a failed job's log folder is kept by design, and the suite's ~500 a run
    would otherwise pile up in /tmp."""
    path = str(tmp_path_factory.mktemp("tmp"))
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # gettempdir() caches its first answer
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture(scope="module", autouse=True)
def no_thread_left_behind(request):
    """After a module, nothing it started may keep a core busy in this xdist worker, nor may a launcher
    thread it started outlive it: a test server's thread looping on a closed socket once burnt ~340 s
    of CPU, a quarter of the suite's, in the tests after it; a store watch retrying a closed store for
    30 s logged into a later test's capture and failed it."""
    before = set(threading.enumerate())
    yield
    threads = threading.enumerate()
    start, t0 = time.process_time(), time.monotonic()
    time.sleep(0.1)
    busy = (time.process_time() - start) / (time.monotonic() - t0)
    assert busy < 0.8, f"{request.module.__name__} left a thread spinning ({busy:.0%} of a core): {threads}"
    ours = [t for t in threads if t not in before and t.name.startswith("launcher-")]
    deadline = time.monotonic() + 2.0  # a thread already ending (a round asked for as the test ended)
    for t in ours:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in ours if t.is_alive()]
    assert not left, f"{request.module.__name__} left launcher threads running: {left}"


# These modules run every test that takes `launch` (or `cluster`) twice: with spawned workers, and with
# workers forked from the --preload zygote; nothing they check may differ (signals and exits, where a
# forked worker's differ).
BOTH_STARTS = {"test_supervise"}
# These run each such test once, forked and spawned in turn down the module, the first forked (the fast
# path the faults strain most): both starts are covered at half the cost (each zygote imports torch once
# for its node, where each spawned worker imports it again: test_launch 35 -> 21 CPU-s, test_bootstrap_store
# 30 -> 15, test_workloads 41 -> 31).
ONE_START = {
    "test_faults",
    "test_faults_nodes",
    "test_faults_store",
    "test_examples",
    "test_bootstrap_store",
    "test_launch",
    "test_workloads",
}
_turns: dict[str, int] = {}  # module -> its tests given one start so far


def pytest_generate_tests(metafunc):
    if "workers_from" not in metafunc.fixturenames:
        return
    if metafunc.module.__name__ in BOTH_STARTS:
        metafunc.parametrize("workers_from", ["spawn", "preload"], indirect=True)
    elif metafunc.module.__name__ in ONE_START and not _parametrized(metafunc, "workers_from"):
        turn = _turns[metafunc.module.__name__] = _turns.get(metafunc.module.__name__, -1) + 1
        metafunc.parametrize("workers_from", [["preload", "spawn"][turn % 2]], indirect=True)


def _parametrized(metafunc, name: str) -> bool:
    return any(name in m.args[0] for m in metafunc.definition.iter_markers("parametrize"))


@pytest.fixture
def workers_from(request) -> str:
    """How the launcher starts workers: "spawn" (a fresh interpreter each) or "preload" (forked)."""
    return getattr(request, "param", "spawn")


@pytest.fixture
def launch(workers_from):
    """The launcher as a subprocess (`run`, `start`); whatever it left running is killed after."""
    l = Launch(preload=workers_from == "preload")
    yield l
    l.cleanup()


@pytest.fixture
def cluster(workers_from):
    """Launcher agents of a multi-node job (`start`, a standalone `store`), each with its own TEST_TOKEN;
    whatever they left running is killed after."""
    c = Cluster(preload=workers_from == "preload")
    yield c
    c.cleanup()


@pytest.fixture
def store_port():
    """A real TCPStore server (the one the agents host), on a free loopback port."""
    server = serve_store()
    yield server.port
    server.close()


@pytest.fixture
def etcd_factory(tmp_path_factory):
    """Start etcd members on demand (`make(n=1, tls=None)`); every one is stopped and its data removed after."""
    members = Members(tmp_path_factory.mktemp)
    yield members.make
    members.close()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """One plain etcd shared by the module's tests that do not hurt it (each test uses its own run id)."""
    members = Members(tmp_path_factory.mktemp)
    member: Member = members.make()[0]
    yield member
    members.close()
