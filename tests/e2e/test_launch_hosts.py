"""scripts/launch_hosts.sh against a real sshd on 127.0.0.1: the hostfile lists 127.0.0.1 twice,
so the script starts two launchers (node ranks 0 and 1) over two ssh sessions.

The sshd runs from a generated config on a free loopback port with a throwaway host key and an
authorized key made for the test; the script reaches it through its SSH override. Skipped, with
the reason, where there is no OpenSSH server (scripts/setup.sh installs openssh-server as root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import system
from support.paths import ROOT, worker
from support.ports import free_port
from support.processes import kill_leftovers, procs_with_token, wait_gone

SCRIPT = ROOT / "scripts" / "launch_hosts.sh"
SSHD = system.which("sshd") or (None if system.NO_SYSTEM or not os.path.exists("/usr/sbin/sshd") else "/usr/sbin/sshd")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """An sshd on 127.0.0.1:<free port> that lets this user in with a key made here; yields SSH."""
    if SSHD is None or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip(system.missing("OpenSSH server/client", "openssh-server openssh-client"))
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True, timeout=30)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    port = free_port()
    (d / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
        "LogLevel ERROR\nAcceptEnv TMPDIR\n"  # the session's temporary files in pytest's tree, as the test's own
    )
    server = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "w")
    )
    ssh = (
        f"ssh -F /dev/null -p {port} -i {d / 'client_key'} -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=10 -o SendEnv=TMPDIR"
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            probe = subprocess.run([*ssh.split(), "127.0.0.1", "echo ok"], capture_output=True, text=True, timeout=20)
            if probe.stdout.strip() == "ok":
                break
            if server.poll() is not None or time.monotonic() > deadline:
                log = (d / "sshd.log").read_text().strip().splitlines()[-3:]
                pytest.skip(f"sshd on 127.0.0.1 does not let us in: {probe.stderr.strip() or log}")
            time.sleep(0.2)
        yield ssh
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


class Hosts:
    """Runs launch_hosts.sh with a unique TEST_TOKEN (forwarded to the remote launchers)."""

    def __init__(self, ssh: str, tmp: Path):
        self.ssh, self.tmp = ssh, tmp
        self.token = uuid.uuid4().hex
        self.hostfile = tmp / "hosts"
        self.hostfile.write_text("# two 'nodes' on one machine\n127.0.0.1\n\n127.0.0.1   # node rank 1\n")
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, env: dict | None = None, opts: tuple[str, ...] = ()) -> subprocess.Popen:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "NCCL_", "GLOO_", "TORCH_"))}
        full.pop("PYTEST_CURRENT_TEST", None)
        full.update(SSH=self.ssh, TEST_TOKEN=self.token, OMP_NUM_THREADS="1", **(env or {}))
        cmd = [
            "bash",
            str(SCRIPT),
            "-f",
            str(self.hostfile),
            "-e",
            "TEST_TOKEN,OMP_NUM_THREADS",
            "--python",
            sys.executable,
            "-p",
            str(free_port()),
            *opts,
            "--",
            *args,
        ]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, cwd=ROOT)
        self.procs.append(p)
        return p

    def cleanup(self) -> None:
        kill_leftovers(self.procs, self.token, settle=5)
        for pid in procs_with_token(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def hosts(sshd, tmp_path):
    h = Hosts(sshd, tmp_path)
    yield h
    h.cleanup()


def marks(folder: Path) -> dict[int, list[str]]:
    return {int(f.name): f.read_text().split() for f in folder.iterdir()}


def wait_ready(folder: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = marks(folder)
        if len(m) == n and all("ready" in v for v in m.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"workers not ready: {marks(folder)}")


def test_two_nodes_run_and_finish_with_host_prefixes_and_the_environment(hosts, tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    p = hosts.start(
        "--nproc_per_node",
        "1",
        worker("dump_env.py"),
        "--flag",
        "it's quoted",
        env={
            "DUMP_DIR": str(dump),
            "PET_MONITOR_INTERVAL": "0.05",
            "NCCL_DEBUG": "WARN",
            "GLOO_SOCKET_IFNAME": "lo",
            "NOT_FORWARDED": "1",
        },
        opts=("-e", "DUMP_DIR"),
    )
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0, out + err
    envs = {int(f.stem): json.loads(f.read_text()) for f in dump.glob("*.json")}
    assert sorted(envs) == [0, 1]
    for rank, d in envs.items():
        e = d["env"]
        assert (e["WORLD_SIZE"], e["GROUP_RANK"], e["MASTER_ADDR"]) == ("2", str(rank), "127.0.0.1")
        assert (e["NCCL_DEBUG"], e["GLOO_SOCKET_IFNAME"], e["DUMP_DIR"]) == ("WARN", "lo", str(dump))
        assert e["TEST_TOKEN"] == hosts.token and "NOT_FORWARDED" not in e
        assert d["argv"] == ["--flag", "it's quoted"]

    p = hosts.start("--nproc_per_node", "1", worker("node_info.py"), env={"SLEEP": "0"}, opts=("-e", "SLEEP"))
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0, out + err
    lines = out.splitlines()
    assert any(l.startswith("[127.0.0.1#0] ") and "info rank=0 world=2 group=0/2" in l for l in lines), out
    assert any(l.startswith("[127.0.0.1#1] ") and "info rank=1 world=2 group=1/2" in l for l in lines), out
    assert not wait_gone(hosts.token)


def test_slots_set_nproc_per_node(hosts):
    hosts.hostfile.write_text("127.0.0.1 slots=2\n127.0.0.1 slots=2\n")
    p = hosts.start(worker("node_info.py"), env={"SLEEP": "0"}, opts=("-e", "SLEEP"))
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0, out + err
    assert sorted(l.split("info ")[1].split()[0] for l in out.splitlines() if "info rank=" in l) == [
        "rank=0",
        "rank=1",
        "rank=2",
        "rank=3",
    ], out
    assert sum("world=4" in l for l in out.splitlines()) == 4, out


def test_uneven_slots_need_the_c10d_rendezvous(hosts):
    hosts.hostfile.write_text("127.0.0.1 slots=2\n127.0.0.1 slots=1\n")
    p = hosts.start(worker("node_info.py"), env={"SLEEP": "0"}, opts=("-e", "SLEEP"))
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "use --rdzv c10d" in err and not out, err
    p = hosts.start(worker("node_info.py"), env={"SLEEP": "0"}, opts=("-e", "SLEEP", "--rdzv", "c10d"))
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0, out + err
    assert sum("world=3" in l for l in out.splitlines()) == 3, out
    assert sorted(l.split("info ")[1].split()[0] for l in out.splitlines() if "info rank=" in l) == [
        "rank=0",
        "rank=1",
        "rank=2",
    ], out


def test_ctrl_c_stops_both_remote_launchers_and_nothing_else(hosts, launch, tmp_path):
    # Another job of the same user on the same "hosts", which must not be touched.
    other_marks = tmp_path / "other"
    other_marks.mkdir()
    other = launch.start(
        "--nproc_per_node", "1", worker("signals.py"), env={"MARK_DIR": str(other_marks), "SLEEP": "60"}
    )
    folder = tmp_path / "marks"
    folder.mkdir()
    p = hosts.start(
        "--nproc_per_node",
        "1",
        worker("signals.py"),
        env={"MARK_DIR": str(folder), "SLEEP": "60"},
        opts=("-e", "MARK_DIR,SLEEP"),
    )
    wait_ready(folder, 2)
    wait_ready(other_marks, 1)
    # the launchers, their workers and guards, the local ssh clients and readers: all carry the token
    assert len(procs_with_token(hosts.token)) >= 6
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert time.monotonic() - t0 < 30
    assert "SIGINT: stopping the launchers on 2 host(s)" in err
    assert "[127.0.0.1#0]" in out and "[127.0.0.1#1]" in out and out.count("got SIGTERM") == 2, (
        out
    )  # streamed to the end
    assert not wait_gone(hosts.token, 10), "processes of the stopped run are left"
    for rank, seen in marks(folder).items():
        assert seen == ["ready", "SIGTERM", "exit"], (rank, seen)  # stopped gracefully, once
    assert other.poll() is None and marks(other_marks)[0] == ["ready"]  # the other job runs on, untouched


def test_sigterm_stops_them_too_and_exits_143(hosts, tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    p = hosts.start(
        "--nproc_per_node",
        "1",
        worker("signals.py"),
        env={"MARK_DIR": str(folder), "SLEEP": "60"},
        opts=("-e", "MARK_DIR,SLEEP"),
    )
    wait_ready(folder, 2)
    p.terminate()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, out + err
    assert not wait_gone(hosts.token, 10)
    assert all(seen[-1] == "exit" for seen in marks(folder).values())


@pytest.mark.parametrize("how", ["grace", "second ctrl-c"])
def test_launchers_that_do_not_stop_are_killed(hosts, tmp_path, how):
    # Workers ignore SIGTERM and their launchers would wait 60 s: --grace 2, or a second Ctrl-C, kills them.
    folder = tmp_path / "marks"
    folder.mkdir()
    p = hosts.start(
        "--nproc_per_node",
        "1",
        "--shutdown_timeout",
        "60",
        worker("signals.py"),
        env={"MARK_DIR": str(folder), "SLEEP": "60", "IGNORE": "SIGTERM"},
        opts=("-e", "MARK_DIR,SLEEP,IGNORE", "--grace", "2" if how == "grace" else "60"),
    )
    wait_ready(folder, 2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    if how == "second ctrl-c":
        deadline = time.monotonic() + 20
        while not all("SIGTERM" in m for m in marks(folder).values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert time.monotonic() - t0 < 20
    assert ("still running after 2 s: killing the launchers" if how == "grace" else "SIGINT again: killing") in err, err
    assert not wait_gone(hosts.token, 10), "the launchers' guards should have killed the workers"
    assert all(m == ["ready", "SIGTERM"] for m in marks(folder).values()), marks(folder)


def test_a_failing_host_stops_the_others_and_gives_the_exit_status(hosts, tmp_path):
    p = hosts.start(
        "--nproc_per_node",
        "1",
        worker("exit_code.py"),
        env={"FAIL_RANK": "1", "CODE": "3", "DELAY": "1", "SLEEP": "60"},
        opts=("-e", "FAIL_RANK,CODE,DELAY,SLEEP"),
    )
    t0 = time.monotonic()
    out, err = p.communicate(timeout=90)
    assert p.returncode == 3, out + err  # the launcher's exit status is its failed worker's
    assert time.monotonic() - t0 < 30  # node 0 did not sleep its 60 s
    assert "launch_hosts: [127.0.0.1#1] exited with 3; stopping the other hosts" in err, err
    assert "[127.0.0.1#0]" in out and "got SIGTERM" in out
    assert not wait_gone(hosts.token, 10)


@pytest.mark.parametrize(
    "hostfile, args, message",
    [
        ("127.0.0.1 cpus=2\n", ["x.py"], "hosts:1: unknown field 'cpus=2'"),
        ("127.0.0.1 slots=0\n", ["x.py"], "slots=0 is not a positive number"),
        ("# nobody\n\n", ["x.py"], "no hosts in"),
        ("127.0.0.1\n", [], "missing the launcher flags and training script"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, hostfile, args, message):
    (tmp_path / "hosts").write_text(hostfile)
    p = subprocess.run(
        ["bash", str(SCRIPT), "-f", str(tmp_path / "hosts"), "--", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, SSH="false"),
    )
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_help():
    p = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "--hostfile" in p.stdout and "SSH=" in p.stdout
