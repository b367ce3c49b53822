"""The load harness (issue 32): a healthy job on a host made busy and flaky, and every judgment the
launcher makes about it counted. Nothing it does is a real failure, so every death, restart or hang the
launcher declares is a false one.

Run:  .venv/bin/python scripts/stress/stress.py [--backend c10d|etcd] [--seconds 600] [--seed N]

The job is the spares shape (scripts/chaos.py --shape spares): `--nnodes 2 --nproc_per_node 2` and a
third agent that waits as a spare, each agent its own node name, on a standalone c10d store or a one-member
etcd. Each agent reaches the store through a TCP relay of its own (tests/support/relay.py), so its
connections can be cut alone. Meanwhile, at once (each fault on one agent at a time, never two on one):
  --busy-per-core N   N busy loops per core for the whole run (CPU oversubscription; default 2)
  --cut-every S       every ~S s, one agent's store connections cut (FIN or RST) and every reconnect
                      refused for --outage s (default 3: a slow reconnect, a lost SYN costs 1 s)
  --pause-every S     every ~S s, one agent SIGSTOPped for --pause s (default 3, half the 6 s liveness
                      timeout), then SIGCONT; its workers and connections stay
  --freeze-every S    every ~S s, one node stopped whole for --pause s: its agent and its workers (not
                      its guard) SIGSTOPped, then SIGCONT, as a paused VM or a stalled host; longer than
                      the default --hang-timeout, so the hang clock must not count it
  --console-rate B    each agent's stdout and stderr are pipes the harness reads at B bytes/s with a
                      2 s stall every 10 s (`--tee 3`: every worker line goes through them): the slow
                      disk under the agent's log path (no dm-delay or FUSE here; see docs/faults.md)
  --hang-timeout S    the agents' --hang_timeout for the whole run (default 2.5, under --pause; 0: none):
                      every worker prints a line and calls launcher.progress() each step, so a false
                      hang is the rule "no output and no progress() for S s"
  --final-hang        at the end, one member's worker stops for real (blocks, alive, no output, no
                      progress): the time from its last progress() call to its agent's "made no
                      progress" line is the real hang, measured under the load; then the restarted
                      round runs before --final-kill
  --final-kill        at the end, one member agent SIGKILLed: the time from the kill to a survivor's
                      "membership changed (... died" line is the real death, measured under the load
Prints one JSON line: the faults injected, the judgments (deaths, restarts, rounds, hangs, store
losses) per agent before the first final fault, the exit codes, and the hang-to-notice and
kill-to-notice times; exit 0 when no false judgment was made.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.etcd import Member  # noqa: E402  (the tests' helpers)
from support.ports import free_port  # noqa: E402
from support.processes import is_helper, parent_pid  # noqa: E402
from support.relay import Relay  # noqa: E402

STEPS = ROOT / "tests" / "workers" / "steps.py"
STEP_TIME = 0.1
# What the launcher says when it judges; with no real fault injected each one is false.
JUDGMENTS = {
    "deaths": r"membership changed \(node with group rank \d+ (died|stopped heartbeating|lost its lease)",
    "membership": r"membership changed",
    "store_lost": r"lost the rendezvous store",
    "hangs": r"made no progress for .* \(--hang_timeout\)",  # the judgment (SIGABRT for the stacks follows)
    "restarts": r"restart(s)? used\)|restarting the workers",
    "closed": r"the job was closed",
}


class Agent:
    """One launcher agent, its output read through pipes at `rate` bytes/s (0: at once)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], rate: int, root: Path):
        self.name, self.rate = name, rate
        self.lines: list[tuple[float, str]] = []  # (when read, line), both streams
        self.busy_until = 0.0  # no second fault on this agent before then
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=root,  # `python -m` puts the working folder first on sys.path: the launcher is root's
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._readers = [threading.Thread(target=self._read, args=(s,), daemon=True) for s in (self.popen.stdout,)]
        self._readers.append(threading.Thread(target=self._read, args=(self.popen.stderr,), daemon=True))
        self.fast = threading.Event()  # set at the end: read what is left at once
        for t in self._readers:
            t.start()

    def _read(self, stream) -> None:
        rest, began = b"", time.monotonic()
        while True:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                return
            now = time.monotonic()
            *whole, rest = (rest + chunk).split(b"\n")
            self.lines.extend((now, line.decode(errors="replace")) for line in whole)
            if self.rate and not self.fast.is_set():
                # the slow disk: this many bytes a second, and a 2 s stall every 10 s
                self.fast.wait(len(chunk) / self.rate + (2.0 if int(now - began) % 10 == 0 else 0.0))

    def text(self, before: float = float("inf")) -> str:
        return "\n".join(line for t, line in list(self.lines) if t < before)

    def first_after(self, pattern: str, t0: float) -> float | None:
        return next((t for t, line in list(self.lines) if t >= t0 and re.search(pattern, line)), None)

    def finish(self, timeout: float) -> int | None:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        self.fast.set()
        for t in self._readers:
            t.join(5)
        return rc

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def store_endpoint(backend: str, folder: Path, root: Path) -> tuple[str, object]:
    """Start the store: (host:port, a handle whose close() stops it)."""
    if backend == "etcd":
        member = Member(folder).start()
        member.close = member.stop
        return member.endpoint, member
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "store", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.stdout.readline()  # it says when it listens

    class Store:
        def close(self) -> None:
            proc.terminate()
            proc.wait(10)

    return f"127.0.0.1:{port}", Store()


def agent_argv(backend: str, endpoint: str, run_id: str, logs: Path, hang_timeout: float) -> list[str]:
    conf = "last_call_timeout=1" + (",is_host=false" if backend == "c10d" else "")
    hang = ["--hang_timeout", f"{hang_timeout:g}"] if hang_timeout else []
    return [
        sys.executable,
        "-m",
        "launcher",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "3",
        "--rdzv_backend",
        backend,
        "--rdzv_endpoint",
        endpoint,
        "--rdzv_id",
        run_id,
        "--rdzv_conf",
        conf,
        "--log_dir",
        str(logs),
        "--tee",
        "3",
        *hang,
        str(STEPS),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["c10d", "etcd"], default="c10d")
    ap.add_argument("--seconds", type=float, default=600.0, help="how long the job trains")
    ap.add_argument("--busy-per-core", type=int, default=2)
    ap.add_argument("--cut-every", type=float, default=15.0, help="0: no cuts")
    ap.add_argument("--outage", type=float, default=3.0)
    ap.add_argument("--pause-every", type=float, default=20.0, help="0: no pauses")
    ap.add_argument("--pause", type=float, default=3.0)
    ap.add_argument("--freeze-every", type=float, default=30.0, help="0: no node freezes")
    ap.add_argument("--console-rate", type=int, default=4096, help="bytes/s; 0: read at once")
    ap.add_argument("--hang-timeout", type=float, default=2.5, help="the agents' --hang_timeout; 0: none")
    ap.add_argument("--final-hang", action="store_true")
    ap.add_argument("--final-kill", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the folder (logs, the agents' output)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the launcher checkout to run (a baseline: another tree)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    folder = Path(tempfile.mkdtemp(prefix=f"stress-{a.backend}-"))
    (folder / "ckpt").mkdir()
    busy = [
        subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
        for _ in range(a.busy_per_core * (os.cpu_count() or 1))
    ]
    endpoint, store = store_endpoint(a.backend, folder, a.root)
    host, port = endpoint.rsplit(":", 1)
    relays = [Relay((host, int(port))) for _ in range(3)]
    env = {
        **os.environ,
        "PYTHONPATH": str(a.root),
        "CKPT_DIR": str(folder / "ckpt"),
        "STEPS": str(int(a.seconds / STEP_TIME)),
        "STEP_TIME": str(STEP_TIME),
        "HANG_FILE": str(folder / "hang"),
    }
    run_id = f"stress{a.seed}"
    agents: list[Agent] = []
    faults: list[dict] = []
    timers: list[threading.Timer] = []
    result: dict = {"backend": a.backend, "seconds": a.seconds, "seed": a.seed, "root": str(a.root)}
    try:

        def start(i: int) -> Agent:
            argv = agent_argv(a.backend, f"127.0.0.1:{relays[i].port}", run_id, folder / "logs", a.hang_timeout)
            return Agent(f"node{i}", argv, env | {"SLURMD_NODENAME": f"node{i}"}, a.console_rate, a.root)

        agents = [start(0), start(1)]
        wait_until(lambda: all(x.first_after(r"start rank=", 0) for x in agents), 120, "the members to start")
        agents.append(start(2))
        wait_until(lambda: agents[2].first_after("waiting as a spare", 0), 120, "the third node to wait as a spare")
        t0 = time.monotonic()
        end = t0 + a.seconds - 15  # the last faults have time to be ridden out before the job ends
        next_cut = t0 + (a.cut_every * rng.uniform(0.5, 1.5) if a.cut_every else float("inf"))
        next_pause = t0 + (a.pause_every * rng.uniform(0.5, 1.5) if a.pause_every else float("inf"))
        next_freeze = t0 + (a.freeze_every * rng.uniform(0.5, 1.5) if a.freeze_every else float("inf"))
        while time.monotonic() < end and all(x.popen.poll() is None for x in agents):
            now = time.monotonic()
            free = [i for i, x in enumerate(agents) if x.busy_until <= now]
            if now >= next_cut and free:
                i = rng.choice(free)
                rst = rng.random() < 0.5
                relays[i].refuse = True
                n = relays[i].cut(rst=rst)
                agents[i].busy_until = now + a.outage + 4.0
                timers.append(threading.Timer(a.outage, setattr, (relays[i], "refuse", False)))
                timers[-1].start()
                faults.append({"at": round(now - t0, 1), "cut": agents[i].name, "rst": rst, "conns": n})
                next_cut = now + a.cut_every * rng.uniform(0.5, 1.5)
            elif now >= next_pause and free:
                i = rng.choice(free)
                os.kill(agents[i].popen.pid, signal.SIGSTOP)
                agents[i].busy_until = now + a.pause + 4.0
                timers.append(threading.Timer(a.pause, os.kill, (agents[i].popen.pid, signal.SIGCONT)))
                timers[-1].start()
                faults.append({"at": round(now - t0, 1), "pause": agents[i].name})
                next_pause = now + a.pause_every * rng.uniform(0.5, 1.5)
            elif now >= next_freeze and free:
                i = rng.choice(free)
                node = node_pids(agents[i].popen.pid)
                for pid in node:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except ProcessLookupError:  # a worker that ended meanwhile
                        pass
                agents[i].busy_until = now + a.pause + 4.0
                timers.append(threading.Timer(a.pause, resume, (node,)))
                timers[-1].start()
                faults.append({"at": round(now - t0, 1), "freeze": agents[i].name, "pids": len(node)})
                next_freeze = now + a.freeze_every * rng.uniform(0.5, 1.5)
            time.sleep(0.05)
        for t in timers:
            t.join()
        kill_at = float("inf")
        if a.final_hang:
            kill_at, result["hang_noticed_s"] = final_hang(agents, folder / "hang")
        if a.final_kill:
            at, result["kill_noticed_s"] = final_kill(agents, 0.0 if kill_at == float("inf") else kill_at)
            kill_at = min(kill_at, at)
        rcs = {x.name: x.finish(max(60.0, a.seconds)) for x in agents}
        result["fault_counts"] = {k: sum(k in f for f in faults) for k in ("cut", "pause", "freeze")}
        result["faults"] = faults
        result["exit_codes"] = rcs
        # before the final kill nothing real happened: every judgment then is a false one
        result["judgments"] = {
            x.name: {k: len(re.findall(p, x.text(kill_at))) for k, p in JUDGMENTS.items()} for x in agents
        }
        result["rounds"] = {x.name: sorted(set(re.findall(r"round=(\d+)", x.text(kill_at)))) for x in agents}
    finally:
        for x in agents:
            x.kill()
        for r in relays:
            r.close()
        store.close()
        for p in busy:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if a.keep:
            for x in agents:
                (folder / f"{x.name}.out").write_text(x.text())
        else:
            shutil.rmtree(folder, ignore_errors=True)
    false = sum(sum(j.values()) - j["membership"] for j in result["judgments"].values())
    false += sum(len(r) > 1 for r in result["rounds"].values())  # a round past 0: a restart or re-form
    result["false_judgments"] = false
    print(json.dumps(result), flush=True)
    return 0 if false == 0 else 1


def node_pids(agent: int) -> list[int]:
    """The agent and its workers (not its guard): what stops when the node stops."""
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) == agent]
    return [agent, *(p for p in children if not is_helper(p))]


def resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # a worker that ended meanwhile
            pass


def final_hang(agents: list[Agent], hang_file: Path) -> tuple[float, dict]:
    """Make one member's worker hang for real (tests/workers/steps.py HANG_FILE): (when asked, the seconds
    from its last progress() to its agent's "made no progress" line and to its "hung" stop line). Returns
    once the restarted round runs again on every member, so a final kill can follow."""
    for x in agents:
        x.fast.set()
    time.sleep(1.0)
    t0 = time.monotonic()
    members = [x for x in agents if x.popen.poll() is None and x.first_after(r"start rank=", 0)]
    spare = next((x for x in agents if x not in members), None)
    if not members:
        return t0, {}
    victim = members[0]
    rank = int(re.findall(r"start rank=(\d+)", victim.text())[-1])
    hang_file.write_text(str(rank))
    offset = time.time() - time.monotonic()  # the worker writes epoch time; lines carry monotonic time
    out: dict = {"rank": rank, "node": victim.name, "spare": spare.name if spare else None}
    try:
        wait_until(lambda: victim.first_after(r"made no progress for", t0), 60, "the agent to judge the hang")
        wait_until(lambda: victim.first_after(r"hung: no progress", t0), 60, "the hung rank to be stopped")
        last = float(Path(f"{hang_file}.at").read_text()) - offset
        out["judged_s"] = round(victim.first_after(r"made no progress for", t0) - last, 3)
        out["stopped_s"] = round(victim.first_after(r"hung: no progress", t0) - last, 3)
        # the restarted round: two nodes' workers start again (the spare may take a member's place)
        wait_until(
            lambda: sum(bool(x.first_after(r"start rank=", t0)) for x in agents) >= 2,
            120,
            "two nodes to run again after the hang",
        )
    except TimeoutError as e:
        out["error"] = str(e)
    return t0, out


def final_kill(agents: list[Agent], since: float) -> tuple[float, float | None]:
    """SIGKILL one member agent (not its guard; one whose workers started after `since`), its output read
    at once from a moment before: (when, seconds until a survivor logs the death)."""
    for x in agents:
        x.fast.set()  # no slow reader between the log line and its time
    time.sleep(1.0)  # what the slow reader held back drains first
    victim = next((x for x in agents if x.first_after(r"start rank=", since) and x.popen.poll() is None), None)
    t0 = time.monotonic()
    if victim is None:  # the job ended before (its own false judgments, counted above)
        return t0, None
    others = [x for x in agents if x is not victim]
    os.kill(victim.popen.pid, signal.SIGKILL)
    pattern = r"membership changed \(node with group rank \d+ (died|lost its lease)"
    try:
        wait_until(lambda: any(x.first_after(pattern, t0) for x in others), 30, "a survivor to notice the kill")
    except TimeoutError:  # no survivor left to notice, or none noticed: the JSON says None
        return t0, None
    return t0, round(min(t for x in others if (t := x.first_after(pattern, t0))) - t0, 3)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
