"""What a user waits for: launch -> every rank's first DDP step, and a worker's death -> every rank's
first step after the restart. torchrun, the launcher, and the launcher with --preload, side by side.

Run:  .venv/bin/python scripts/bench/warm_start.py [--ranks 4,8] [--reps 3] [--resume-timeout 20]

Each job is `<tool> --standalone --nproc_per_node N --max_restarts 1 worker.py OUT` on gloo (CPU):
a small DDP model (two Linear layers), SGD, one step per iteration. Every worker stamps
time.time() right after its first optimizer step. On attempt 0, once every rank has stamped, this
script samples the workers' memory (PSS, from /proc/PID/smaps_rollup; with --preload also the
zygote's) and then lets rank 1 stamp and `os._exit(1)` at its next step; the tool restarts the
group, and every rank of attempt 1 stamps its first step again, runs 3 more and exits 0.
  launch = max(attempt-0 first-step stamps) - the moment this script started the tool
  resume = max(attempt-1 first-step stamps) - rank 1's death stamp
A restart that does not reach every rank's first step within --resume-timeout s is "never" (torchrun
2.13's restart on its own store fails with gloo, pytorch#135712). The zygote's own import time is
measured too: a fresh interpreter importing the preload set (launcher.parsers.PRELOAD_DEFAULTS) the
way the zygote does, from its start to the end of the imports. Tools alternate within each repetition; figures are medians over --reps.

Targets (issue 16): resume <= 0.3 s at 4 ranks; launch <= zygote import + 0.5 s and >= 2x faster
than torchrun; workers' total PSS at 8 ranks <= 60 % of spawned workers'. Reports only.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import DDP_IMPORTS, DDP_MODEL, PY, TOOLS, cpu_snapshot, other_load, revision

ROOT = Path(__file__).resolve().parents[2]

WORKER = (
    DDP_IMPORTS
    + """attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
def stamp(name, text=""):
    with open(f"{out}/{name}.tmp", "w") as f:
        f.write(f"{time.time()!r} {os.getpid()} {text}")
    os.rename(f"{out}/{name}.tmp", f"{out}/{name}")
"""
    + DDP_MODEL
    + """for step in range(1000000):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 0:
        stamp(f"first-{attempt}-{rank}")
    if attempt == 0 and rank == 1 and step >= 1:
        while not os.path.exists(f"{out}/kill"):
            time.sleep(0.005)
        stamp("death")
        os._exit(1)
    if attempt >= 1 and step >= 3:
        break
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
dist.destroy_process_group()
"""
)

# Start-up and imports only: os._exit skips the ~0.6 s an interpreter with torch takes to tear down.
ZYGOTE_IMPORT = (
    "import os; from launcher.parsers import PRELOAD_DEFAULTS; from launcher.agent.zygote.server import preload; "
    "r = preload(PRELOAD_DEFAULTS); assert not r.error, r; os._exit(0)"
)


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def zygote_pid(agent: int) -> int | None:
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            pid = int(comm.split("/")[2])
            if open(comm).read().strip() == "launcher-zygote" and agent in _ancestors(pid):
                return pid
        except (OSError, ValueError):
            continue
    return None


def _ancestors(pid: int) -> list[int]:
    seen = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        seen.append(pid)
    return seen


def stamps(out: str, prefix: str) -> dict[str, tuple[float, int]]:
    found = {}
    for path in glob.glob(os.path.join(out, prefix + "*")):
        if not path.endswith(".tmp"):
            t, pid = open(path).read().split()[:2]
            found[os.path.basename(path)] = (float(t), int(pid))
    return found


def all_of(found: dict, n: int) -> dict | None:
    return found if len(found) == n else None


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    return None


def one_job(tool: str, n: int, script: str, resume_timeout: float) -> dict:
    out = tempfile.mkdtemp(prefix="warm-")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OMP_NUM_THREADS", None)  # each tool applies torchrun's rule (1 thread per worker)
    cmd = [*TOOLS[tool], "--standalone", "--nproc_per_node", str(n), "--max_restarts", "1", script, out]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    result: dict = {"tool": tool, "n": n}
    try:
        first = wait_for(lambda: all_of(stamps(out, "first-0-"), n), 120)
        if not first:
            result["error"] = "attempt 0 never stepped"
            return result
        result["launch"] = max(t for t, _ in first.values()) - t0
        time.sleep(0.3)  # let the steady state settle before sampling memory
        pids = [pid for _, pid in first.values()]
        result["pss"] = sum(pss_kib(pid) for pid in pids) / 1024
        zygote = zygote_pid(p.pid)
        result["pss_zygote"] = pss_kib(zygote) / 1024 if zygote else 0.0
        open(os.path.join(out, "kill"), "w").close()
        death = wait_for(lambda: stamps(out, "death"), 30)
        again = wait_for(lambda: all_of(stamps(out, "first-1-"), n), resume_timeout)
        if death and again:
            result["resume"] = max(t for t, _ in again.values()) - death["death"][0]
        else:
            result["resume"] = None
        try:
            p.wait(timeout=30 if again else 1)
        except subprocess.TimeoutExpired:
            pass
        return result
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        subprocess.run(["rm", "-rf", out])


def zygote_import_seconds() -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    t = time.perf_counter()
    subprocess.run([PY, "-c", ZYGOTE_IMPORT], check=True, env=env)
    return time.perf_counter() - t


def fmt(values: list, unit: str = " s", digits: int = 2) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"never ({len(values)}/{len(values)})"
    text = f"{statistics.median(got):.{digits}f}{unit}"
    return text + (f", never {len(values) - len(got)}/{len(values)}" if len(got) < len(values) else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="4,8", help="comma-separated worker counts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--resume-timeout", type=float, default=20.0)
    args = ap.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ddp_worker.py")
        Path(script).write_text(WORKER)
        before = cpu_snapshot()
        rows: dict[tuple[str, int], list[dict]] = {}
        imports = []
        for rep in range(args.reps):
            imports.append(zygote_import_seconds())
            for n in sizes:
                tools = list(TOOLS) if rep % 2 == 0 else list(reversed(TOOLS))
                for tool in tools:
                    r = one_job(tool, n, script, args.resume_timeout)
                    rows.setdefault((tool, n), []).append(r)
                    print(
                        f"rep {rep} n={n} {tool}: "
                        + ", ".join(
                            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r.items()
                            if k not in ("tool", "n")
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
        after = cpu_snapshot()
    zyg = statistics.median(imports)
    print(
        f"# warm start, {datetime.date.today()}, {revision()}, {os.cpu_count()} cores, torch "
        f"{subprocess.run([PY, '-c', 'import torch; print(torch.__version__)'], capture_output=True, text=True).stdout.strip()}, "
        f"{args.reps} reps, other load {other_load(before, after):.2f} cores"
    )
    print(f"zygote import (fresh interpreter, preload set): {zyg:.2f} s")
    print()
    print(
        "| ranks | tool | launch → every rank's first step | worker death → every rank's first step again | workers' PSS (+ zygote) |"
    )
    print("|---|---|---|---|---|")
    for n in sizes:
        for tool in TOOLS:
            rs = [r for r in rows[(tool, n)] if "error" not in r]
            pss = fmt([r["pss"] for r in rs], " MiB", 0)
            if tool.endswith("--preload"):
                pss += f" (+ {statistics.median([r['pss_zygote'] for r in rs]):.0f})" if rs else ""
            print(
                f"| {n} | {tool} | {fmt([r['launch'] for r in rs])} | {fmt([r['resume'] for r in rs], digits=3)} | {pss} |"
            )
    print()
    for n in sizes:
        med = {t: [r for r in rows[(t, n)] if "error" not in r] for t in TOOLS}

        def m(tool: str, key: str, med=med):
            got = [r[key] for r in med[tool] if r.get(key) is not None]
            return statistics.median(got) if got else None

        pre, plain, torch_ = m("launcher --preload", "launch"), m("launcher", "launch"), m("torchrun", "launch")
        rp, rl = m("launcher --preload", "resume"), m("launcher", "resume")
        sp, sl, sz = m("launcher --preload", "pss"), m("launcher", "pss"), m("launcher --preload", "pss_zygote")
        parts = [f"{n} ranks"]
        if pre and torch_:
            parts.append(
                f"launch {torch_ / pre:.1f}x faster than torchrun, {plain / pre:.1f}x than spawning; "
                f"{pre - zyg:+.2f} s over the zygote's own import"
            )
        if rp and rl:
            parts.append(f"resume {rl / rp:.1f}x faster than spawning")
        if sp and sl:
            parts.append(f"PSS {100 * sp / sl:.0f} % of spawned ({100 * (sp + (sz or 0)) / sl:.0f} % with the zygote)")
        print("- " + parts[0] + ": " + "; ".join(parts[1:]))


if __name__ == "__main__":
    main()
