"""Elastic rendezvous on the c10d backend: several real launcher processes meeting on a real TCPStore."""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest
from support.launcher_runs import c10d, finish, infos, wait_line
from support.paths import LAUNCHER, worker
from support.ports import free_port


@pytest.mark.parametrize("n", [2, 4])
def test_fixed_size_rounds(launch, n):
    port = free_port()
    procs = [launch.start(*c10d(port, str(n), nproc=2), worker("node_info.py"), env={"SLEEP": "0.5"}) for _ in range(n)]
    results = finish(procs)
    assert all(rc == 0 for rc, _, _ in results), [e for _, _, e in results]
    seen = [i for _, out, _ in results for i in infos(out)]
    assert sorted(int(i["rank"]) for i in seen) == list(range(2 * n))
    assert {i["world"] for i in seen} == {str(2 * n)} and {i["restart"] for i in seen} == {"0"}
    assert len({i["master"] for i in seen}) == 1


def test_heterogeneous_nodes_get_correct_ranks(launch):
    port = free_port()
    procs = [launch.start(*c10d(port, "2", nproc=n), worker("node_info.py"), env={"SLEEP": "0.3"}) for n in (1, 3)]
    results = finish(procs)
    assert all(rc == 0 for rc, _, _ in results), [e for _, _, e in results]
    seen = [i for _, out, _ in results for i in infos(out)]
    assert sorted(int(i["rank"]) for i in seen) == [0, 1, 2, 3] and {i["world"] for i in seen} == {"4"}


def test_elastic_growth_from_one_to_three(launch):
    port = free_port()
    first = launch.start(*c10d(port, "1:3"), worker("node_info.py"), env={"SLEEP": "6"})
    wait_line(first, "world=1")  # node 1 seals a round alone after the 1 s last call, then runs
    more = [launch.start(*c10d(port, "1:3"), worker("node_info.py"), env={"SLEEP": "6"}) for _ in range(2)]
    results = finish([first, *more])
    assert all(rc == 0 for rc, _, _ in results), [e for _, _, e in results]
    first_rounds = infos(results[0][1])
    assert first_rounds[0]["world"] == "1"
    last = first_rounds[-1]
    assert last["world"] == "3" and last["restart"] == "0"  # membership changes are not restarts
    assert "group=0/3" in f"group={last['group']}"  # the first node keeps its rank


def test_worker_failure_restarts_every_node_once(launch):
    port = free_port()
    procs = [
        launch.start(
            *c10d(port, "2", "--max_restarts", "1", nproc=2),
            worker("node_info.py"),
            env={"SLEEP": "1.5", "FAIL_RANK": "3"},
        )
        for _ in range(2)
    ]
    results = finish(procs)
    assert all(rc == 0 for rc, _, _ in results), [e for _, _, e in results]
    for _, out, _ in results:
        rounds = infos(out)
        assert [i["restart"] for i in rounds] == ["0", "0", "1", "1"]  # charged once for the whole job


def test_budget_exhausted_stops_every_node_promptly(launch):
    port = free_port()
    procs = [
        launch.start(*c10d(port, "2", nproc=1), worker("node_info.py"), env={"SLEEP": "60", "FAIL_RANK": "1"})
        for _ in range(2)
    ]
    t0 = time.monotonic()
    results = finish(procs, timeout=30)
    assert time.monotonic() - t0 < 20
    assert all(rc != 0 for rc, _, _ in results)
    assert any("closed" in err or "restart budget" in err or "no restarts left" in err for _, _, err in results)


def kill_the_other(launch, nnodes: str, sleep: str):
    """Two agents on the first one's store; once both run their workers, the second is SIGKILLed. -> the first."""
    port = free_port()
    host = launch.start(*c10d(port, nnodes, conf="is_host=true"), worker("node_info.py"), env={"SLEEP": sleep})
    victim = launch.start(*c10d(port, nnodes, conf="is_host=false"), worker("node_info.py"), env={"SLEEP": sleep})
    host.victim_group = int(re.search(r"group=(\d)/", wait_line(victim, "world=2"))[1])  # the tickets race
    victim.send_signal(signal.SIGKILL)
    return host


def test_dead_agent_elastic_survivors_reform(launch):
    host = kill_the_other(launch, "1:2", "12")
    t0 = time.monotonic()
    seen = wait_line(host, "world=1 group=0/1", timeout=15)
    assert time.monotonic() - t0 < 6, seen  # the guard's death certificate (ms) + re-forming
    host.kill()


def test_dead_agent_fixed_size_stops_with_clear_message(launch):
    host = kill_the_other(launch, "2", "30")
    rc = host.wait(15)
    err = host.stderr.read()
    assert rc != 0 and "fewer than 2" in err, err
    # the true reason, once: the node lost, who closed the job; no re-forming promised
    reason = re.findall(r"launcher: reason: (.*)", err)
    assert len(reason) == 1 and re.fullmatch(
        rf"the job was closed: node with group rank {host.victim_group} died \(its store session ended\); "
        r"1 node\(s\) left, fewer than 2, and no restart left to replace it \(--max_restarts 0\); closed by node \S+",
        reason[0],
    ), err
    assert "re-forming" not in err and "closed the connection" not in err, err


def test_other_run_id_never_joins(launch):
    port = free_port()
    # Job a's first node holds the store: were it b's (whoever binds first), b's exit would take it away.
    a = [
        launch.start(*c10d(port, "2", run_id="a", conf=f"is_host={i == 0}"), worker("node_info.py"), env={"SLEEP": "3"})
        for i in range(2)
    ]
    b = launch.start(*c10d(port, "2", run_id="b", conf="join_timeout=2,is_host=false"), worker("node_info.py"))
    rc_b = b.wait(30)
    assert rc_b != 0 and "join_timeout" in b.stderr.read()
    results = finish(a)
    assert all(rc == 0 for rc, _, _ in results), [e[-2000:] for _, _, e in results]
    assert sorted(int(i["rank"]) for _, out, _ in results for i in infos(out)) == [0, 1]


def test_join_timeout_is_a_clear_error(launch):
    r = launch.run(*c10d(free_port(), "2", conf="join_timeout=1"), worker("node_info.py"), timeout=60)
    assert r.returncode == 1
    assert "no round formed within 1 s (join_timeout)" in r.stderr and "Traceback" not in r.stderr


def test_standalone_store_binds_only_the_given_address(launch):
    port = free_port()
    store = start_store(launch, port)
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    local_addresses = {line.split()[3] for line in listening.splitlines()}
    assert local_addresses == {f"127.0.0.1:{port}"}, listening  # not the wildcard
    procs = [
        launch.start(*c10d(port, "2", conf="is_host=false"), worker("node_info.py"), env={"SLEEP": "0.3"})
        for _ in range(2)
    ]
    assert all(rc == 0 for rc, _, _ in finish(procs))
    store.send_signal(signal.SIGTERM)
    assert store.wait(10) == 0


def test_unknown_rdzv_conf_key_is_one_warning(launch):
    """torchrun ignores a key it does not know; the launcher runs too, and says so in one line."""
    r = launch.run(*c10d(free_port(), "1", conf="heartbeat=3"), worker("node_info.py"), timeout=60)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "--rdzv_conf heartbeat " in line]
    assert len(notes) == 1 and notes[0].endswith("; ignored"), r.stderr  # no key is near: no suggestion


def start_store(launch, port: int) -> subprocess.Popen:
    store = subprocess.Popen(
        [*LAUNCHER, "store", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env=launch.env(),
    )
    launch.procs.append(store)
    assert "serving" in store.stdout.readline()
    return store


def test_join_token_keeps_other_nodes_out(launch, tmp_path):
    port = free_port()
    start_store(launch, port)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    logs = tmp_path / "logs"
    files = ("--log_dir", str(logs), "--events_file", str(tmp_path / "events.jsonl"))
    good = [
        launch.start(
            *c10d(port, "2", *files, conf=f"is_host=false,join_token_file={token_file}"),
            worker("dump_env.py"),
            env={"DUMP_DIR": str(tmp_path)},
        ),
        launch.start(
            *c10d(port, "2", *files, conf="is_host=false"),
            worker("dump_env.py"),
            env={"DUMP_DIR": str(tmp_path), "LAUNCHER_JOIN_TOKEN": "s3cret"},
        ),
    ]
    results = finish(good)
    assert all(rc == 0 for rc, _, _ in results)
    # The secret stays with the agents: not in the workers' environment, the logs, the events file,
    # the console, or the store (which holds only an HMAC of it).
    written = [f for f in tmp_path.rglob("*") if f.is_file() and f != token_file]
    assert len(written) >= 3 and any(logs in f.parents for f in written), written
    for f in written:
        assert "s3cret" not in f.read_text(errors="replace"), f
    assert not any("s3cret" in out + err for _, out, err in results)
    from launcher.rendezvous.c10d import TCPStoreAdapter

    st = TCPStoreAdapter("127.0.0.1", port, 10, connect_timeout=10)
    try:
        token_key = st.get("job/token") or b""
        assert token_key and b"s3cret" not in token_key
    finally:
        st.close()
    wrong = launch.run(
        *c10d(port, "2", conf="is_host=false"), worker("node_info.py"), env={"LAUNCHER_JOIN_TOKEN": "guess"}, timeout=60
    )
    assert wrong.returncode == 1 and "wrong join token" in wrong.stderr and "guess" not in wrong.stderr
    missing = launch.run(*c10d(port, "2", conf="is_host=false"), worker("node_info.py"), timeout=60)
    assert missing.returncode == 1 and "needs a join token" in missing.stderr


def test_join_token_is_never_a_command_line_value(launch):
    r = launch.run(*c10d(free_port(), "2", conf="join_token=abc"), worker("node_info.py"), timeout=30)
    assert r.returncode == 2 and "would show in ps" in r.stderr
