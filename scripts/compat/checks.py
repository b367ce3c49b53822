"""The worker-side checks of one torch version, run by scripts/compat.sh inside that version's venv.

Each check runs the launcher (`python -m launcher`, this checkout on PYTHONPATH) with this venv's
torch in the workers, and prints one line, PASS or FAIL with a reason; the last line is the row of
the matrix in scripts/bench/RESULTS.md. Exit status: the number of failed checks (0: all passed).

    python scripts/compat/checks.py [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LAUNCHER = [sys.executable, "-m", "launcher"]
# this checkout's launcher, as the runs take it (PYTHONPATH in `env`): its port picker stays below the
# kernel's ephemeral range, where a picked-then-released port cannot go to an outgoing connection
sys.path.insert(0, ROOT)
from launcher.net import free_port  # noqa: E402

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TIMEOUT = 240.0  # seconds for one launcher run (CUDA builds import slowly on a busy host)

# What may differ from torchrun's worker environment, and why: ports and ids are fresh per run, the
# error file's folder has our name, MASTER_ADDR is loopback on one node (torchrun's is the FQDN).
INTENDED = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR", "_", "DUMP_DIR"}
# LAUNCHER_INPLACE_SLOTS: the workers' folder in memory, where a `Job` script's kept state is copied (docs/memory.md)
OURS_ONLY = {"LAUNCHER_AGENT_ID", "LAUNCHER_ROUND", "LAUNCHER_PROGRESS_FILE", "LAUNCHER_INPLACE_SLOTS"}


class Failed(Exception):
    """A check failed; the message says why, in one line."""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def run(cmd: list[str], extra: dict[str, str] | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run `cmd` in its own session; on a timeout its whole process group is killed."""
    p = start(cmd, extra)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise Failed(f"{' '.join(cmd[2:4])}… still running after {timeout:g} s; stderr: {tail(err)}") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def start(cmd: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        env={**env(), **(extra or {})},
        stdin=subprocess.PIPE,  # the torch store host lives until its stdin closes
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def tail(text: str, n: int = 300) -> str:
    return " | ".join(text.strip().splitlines()[-4:])[-n:]


def ok(r: subprocess.CompletedProcess, what: str) -> None:
    if r.returncode != 0:
        raise Failed(f"{what} exited {r.returncode}: {tail(r.stderr or r.stdout)}")


# ---------------------------------------------------------------------------- the checks


def env_parity() -> str:
    """Every variable torchrun gives its workers, with torchrun's value (what must differ aside)."""
    if not os.path.exists(TORCHRUN):
        raise Failed("no torchrun in this venv")
    args = ["--nproc_per_node", "2", "--max_restarts", "2", os.path.join(HERE, "dump_env.py"), "a", "--b"]
    dumps = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in (("torchrun", [TORCHRUN, *args]), ("launcher", [*LAUNCHER, *args])):
            folder = os.path.join(tmp, name)
            os.mkdir(folder)
            ok(run(cmd, {"DUMP_DIR": folder}), name)
            dumps[name] = {int(f[:-5]): json.load(open(os.path.join(folder, f))) for f in os.listdir(folder)}
    theirs, ours = dumps["torchrun"], dumps["launcher"]
    if sorted(theirs) != [0, 1] or sorted(ours) != [0, 1]:
        raise Failed(f"ranks: torchrun {sorted(theirs)}, launcher {sorted(ours)}")
    extra = set()
    for rank in (0, 1):
        t, o = theirs[rank]["env"], ours[rank]["env"]
        missing = set(t) - set(o)
        if missing:
            raise Failed(f"rank {rank} lacks {sorted(missing)}")
        differ = sorted(k for k in set(t) - INTENDED if o[k] != t[k])
        if differ:
            raise Failed(f"rank {rank}: {', '.join(f'{k}={o[k]!r} (torchrun {t[k]!r})' for k in differ[:3])}")
        if theirs[rank]["argv"] != ours[rank]["argv"]:
            raise Failed(f"argv {ours[rank]['argv']} (torchrun {theirs[rank]['argv']})")
        extra |= set(o) - set(t) - OURS_ONLY
    return f"{len(theirs[0]['env'])} variables equal" + (f"; ours also sets {sorted(extra)}" if extra else "")


def _ddp(preload: bool) -> str:
    flags = ["--preload"] if preload else []
    r = run([*LAUNCHER, "--nproc_per_node", "2", *flags, os.path.join(HERE, "ddp.py")])
    ok(r, "the launcher")
    lines = [line for line in r.stdout.splitlines() if "ddp ok" in line]
    if len(lines) != 2:
        raise Failed(f"{len(lines)} of 2 ranks reported; stdout: {tail(r.stdout)}")
    if preload and not all("forked=True" in line for line in lines):
        raise Failed(f"the workers were not forked from the zygote: {tail(r.stderr)}")
    noise = [line for line in (r.stdout + r.stderr).splitlines() if "nanobind" in line or "leaked" in line]
    if noise:
        raise Failed(f"{len(noise)} lines at exit, e.g. {noise[0].strip()!r}")
    return "2 ranks, gradients equal" + (", forked" if preload else "")


def ddp_gloo() -> str:
    """DDP on gloo, two spawned workers, normal interpreter exit."""
    return _ddp(preload=False)


def ddp_gloo_preload() -> str:
    """The same, forked from the --preload zygote: nothing printed at exit (no nanobind leak reports)."""
    return _ddp(preload=True)


def store_ops() -> str:
    """Every TCPStore client op of this torch against the store the agent serves the workers."""
    r = run([*LAUNCHER, "--nproc_per_node", "3", os.path.join(HERE, "store_ops.py")])
    ok(r, "the launcher")
    lines = [line for line in r.stdout.splitlines() if "store ok" in line]
    if len(lines) != 3:
        raise Failed(f"{len(lines)} of 3 ranks reported; stderr: {tail(r.stderr)}")
    return lines[0].split("ops=")[1]


def c10d_three_agents_restart() -> str:
    """Three agents on a c10d rendezvous, 2 workers each; a worker fails once, every node restarts."""
    port = free_port()
    args = [
        *LAUNCHER,
        "--nnodes",
        "3",
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        f"compat{port}",
        os.path.join(HERE, "restart.py"),
    ]
    return _agents(args, agents=3, ranks=6)


def torch_hosts_rdzv_store() -> str:
    """Two agents on a c10d rendezvous whose store is torch's own TCPStore (`--rdzv_conf is_host=false`)."""
    host = start(
        [
            sys.executable,
            "-c",
            "import sys, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, is_master=True, "
            "wait_for_workers=False); print(s.port, flush=True); sys.stdin.read()",
        ]
    )
    try:
        port = host.stdout.readline().strip()
        if not port.isdigit():
            raise Failed(f"torch's TCPStore did not start: {tail(host.stderr.read())}")
        args = [
            *LAUNCHER,
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--max_restarts",
            "1",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
            "--rdzv_id",
            f"hosted{port}",
            "--rdzv_conf",
            "is_host=false,join_timeout=40",
            os.path.join(HERE, "restart.py"),
        ]
        return _agents(args, agents=2, ranks=2)
    finally:
        os.killpg(host.pid, signal.SIGKILL)
        host.communicate()


def _agents(args: list[str], agents: int, ranks: int) -> str:
    """Start `agents` launchers of `restart.py`: every rank reduces 1 + … + ranks after one restart."""
    total = f"sum={ranks * (ranks + 1) // 2}"
    procs = [start(args) for _ in range(agents)]
    deadline = time.monotonic() + TIMEOUT
    outs = []
    try:
        for a in procs:
            try:
                outs.append(a.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise Failed(f"an agent still running after {TIMEOUT:g} s") from None
    finally:
        for a in procs:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.communicate()
    codes = [a.returncode for a in procs]
    if codes != [0] * agents:
        worst = next(err for (_, err), c in zip(outs, codes) if c != 0)
        raise Failed(f"agents exited {codes}: {tail(worst)}")
    reduced = [line for out, _ in outs for line in out.splitlines() if "reduced" in line]
    if len(reduced) != ranks:
        raise Failed(f"{len(reduced)} ranks reduced: {tail(' | '.join(o for o, _ in outs))}")
    if not all("restart=1" in line and total in line for line in reduced):
        raise Failed(f"not every rank reduced {total} after one restart: {reduced[:2]}")
    return f"{agents} agents, {len(reduced)} ranks, one restart"


def _exact_run(recovery: str, die: str) -> tuple[dict[int, set[str]], dict[int, list[int]], str]:
    """tests/workers/in_place_exact.py on 3 forked ranks: each rank's final (steps, weights, buffers), the
    steps its processes applied, and the launcher's stderr."""
    with tempfile.TemporaryDirectory() as logs:
        worker = os.path.join(ROOT, "tests", "workers", "in_place_exact.py")
        cmd = [*LAUNCHER, "--preload", "--nproc_per_node", "3", "--recovery", recovery, "--max_restarts", "2"]
        r = run([*cmd, "--no-live", worker], {"STEP_LOG": logs, **({"DIE_AT": die} if die else {})})
        ok(r, f"--recovery {recovery} {die or 'undisturbed'}")
        finals: dict[int, set[str]] = {}
        applied: dict[int, list[int]] = {}
        for name in os.listdir(logs):
            rank = int(name.split(".")[0])
            for line in open(os.path.join(logs, name)).read().splitlines():
                kind, *rest = line.split()
                if kind == "final":
                    finals.setdefault(rank, set()).add(" ".join(rest))
                elif kind == "applied":
                    applied.setdefault(rank, []).append(int(rest[0]))
    return finals, applied, r.stdout + r.stderr


def in_place_exact() -> str:
    """A rank lost in a step: in place, and a restart of the group from the copies in memory, end with the
    undisturbed run's weights and buffers bit for bit, each step applied once (the restart: at most twice)."""
    ref, _, _ = _exact_run("in-place", "")
    for recovery, die, again in (("in-place", "1 5 before", 0), ("restart", "1 5 after", 1)):
        finals, applied, err = _exact_run(recovery, die)
        if finals != ref:
            raise Failed(f"--recovery {recovery}, rank 1 lost in step 5: the weights differ; {tail(err)}")
        for rank, steps in applied.items():
            if sorted(set(steps)) != list(range(24)) or len(steps) - 24 > again:
                raise Failed(f"--recovery {recovery}: rank {rank} applied {sorted(steps)}")
        if recovery == "restart" and err.count("resumed at step 5 from its copy in memory") != 3:
            raise Failed(f"the restart did not resume at step 5 from memory: {tail(err)}")
    return "in place and a restart from memory: the undisturbed weights, bit for bit"


CHECKS: dict[str, Callable[[], str]] = {
    "env_parity": env_parity,
    "ddp_gloo": ddp_gloo,
    "ddp_gloo_preload": ddp_gloo_preload,
    "store_ops": store_ops,
    "c10d_3_agents_restart": c10d_three_agents_restart,
    "torch_hosts_rdzv_store": torch_hosts_rdzv_store,
    "in_place_exact": in_place_exact,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    only = [n for n in parser.parse_args().only.split(",") if n]
    unknown = set(only) - set(CHECKS)
    if unknown:
        parser.error(f"unknown check(s) {sorted(unknown)}; known: {', '.join(CHECKS)}")
    version = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, env=env()
    ).stdout.strip()
    print(f"torch {version}, python {sys.version.split()[0]}", flush=True)
    cells, failed = [], 0
    for name, check in CHECKS.items():
        if only and name not in only:
            cells.append("–")
            continue
        t0 = time.monotonic()
        try:
            detail = check()
        except Failed as e:
            failed += 1
            cells.append("FAIL")
            print(f"FAIL {name} ({time.monotonic() - t0:.0f} s): {e}", flush=True)
        else:
            cells.append("pass")
            print(f"PASS {name} ({time.monotonic() - t0:.0f} s): {detail}", flush=True)
    print(f"| {version} | " + " | ".join(cells) + " |")
    return failed


if __name__ == "__main__":
    sys.exit(main())
