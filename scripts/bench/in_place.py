"""One rank killed mid-step: in place (`--recovery in-place`) vs a restart of the group with
--preload vs torchrun, for model states of 10 MB, 200 MB and 1 GB and a torch.compile'd model.

Run:  .venv/bin/python scripts/bench/in_place.py [--reps 2] [--ranks 4] [--configs 10,200,1000,compile,compile-pre]

Each job: `<tool> --nproc_per_node N --max_restarts 1 worker.py OUT SIZE COMPILE` on gloo (CPU).
The worker (below) trains a small DDP model (examples/train_ddp.py's) through launcher.worker.inplace.Job,
which keeps the model, the optimizer and a blob of SIZE MB (float32, outside DDP's all-reduce: the
"rest" of a model's state, which a restart reads back and an in-place newcomer receives). In the
restart modes rank 0 checkpoints model, optimizer and blob every CKPT_EVERY steps (torch.save to
the job's folder; not timed) and a restarted rank loads it; in place nothing is written. Every rank
stamps (steps done, time) after each step. Rank 1 SIGKILLs itself in step KILL_AT of attempt 0,
after its forward (the others are in or near the backward's all-reduce), stamping the time first.
  back = every rank's first step done after the kill - the kill
  lost = every rank has done the step that was in flight again - the kill - one step's time
         (what the failure added to the job's wall time; a restart also redoes the steps since what it
          resumes from: its copy in memory (docs/memory.md, the step in flight alone), or without it
          (`nomemory`, and torchrun, which has no agent's memory) the checkpoint: KILL_AT - CKPT_EVERY more)
  again = the steps rank 0 ran again after the kill (those done before it, and the one in flight)
  move = in place, the newcomer's seconds receiving the state (the source's GB/s beside it)
`back - move` is what the survivors lose beyond the transfer: it should not grow with SIZE.
The tools alternate within each repetition; figures are medians. Reports only, asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import PY, TORCHRUN, cpu_snapshot, other_load, revision

ROOT = Path(__file__).resolve().parents[2]
KILL_AT, CKPT_EVERY, STEPS, STEP_TIME = 12, 10, 16, 0.02
COMPILER = "torch._dynamo,torch._inductor.compile_fx"  # what a first torch.compile call imports (seconds)
TOOLS = {
    "in place (--preload)": [PY, "-m", "launcher", "--preload", "--recovery", "in-place"],
    "in place, zeroed": [PY, "-m", "launcher", "--preload", "--recovery", "in-place"],
    "in place, no copy in memory": [PY, "-m", "launcher", "--preload", "--recovery", "in-place"],
    "restart, --preload": [PY, "-m", "launcher", "--preload"],
    "restart, --preload, no copy in memory": [PY, "-m", "launcher", "--preload"],
    "torchrun": [TORCHRUN, "--standalone"],
}
NO_MEMORY = {
    "restart, --preload, no copy in memory",
    "in place, no copy in memory",
}  # LAUNCHER_STATE_IN_MEMORY=0: the checkpoint file alone

WORKER = f"""
import time
began = time.time()
import json, os, signal, sys
import torch, torch.nn as nn
from launcher.worker.inplace import Job

out, size_mb, compiled, FRESH = sys.argv[1], int(sys.argv[2]), sys.argv[3] != "0", sys.argv[4] == "1"
KILL_AT, CKPT_EVERY, STEPS, STEP_TIME = {KILL_AT}, {CKPT_EVERY}, {STEPS}, {STEP_TIME}
script = [("script", began), ("imported", time.time())]
job = Job()
script.append(("job", time.time()))
rank, attempt = job.rank, int(os.environ["TORCHELASTIC_RESTART_COUNT"])
log = open(f"{{out}}/steps-{{rank}}-{{os.getpid()}}", "a", buffering=1)


class Blob(nn.Module):  # the rest of a model's state: a frozen parameter, copied to memory beside a step

    def __init__(self, mb, fresh):  # a replacement's is overwritten by the transfer: no need to zero it
        super().__init__()
        t = (torch.empty if fresh and FRESH else torch.zeros)(mb * (1 << 20) // 4)
        self.t = nn.Parameter(t, requires_grad=False)


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
blob = Blob(size_mb, job.joining)
script.append(("allocated", time.time()))
job.keep(model=net, optimizer=opt, blob=blob)
ckpt = f"{{out}}/ckpt.pt"
if not job.in_place and attempt > 0 and os.path.exists(ckpt) and not job.resumes():  # else the copy replaces it
    state = torch.load(ckpt)
    net.load_state_dict(state["model"]), opt.load_state_dict(state["optimizer"]), blob.load_state_dict(state["blob"])
    job.step = state["step"]
job.ddp(torch.compile(net) if compiled else net)
script.append(("steps", time.time()))
x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
for step in job.steps(STEPS):
    with step:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(job.model(x), y)
        if attempt == 0 and step.index == KILL_AT and rank == 1:
            with open(f"{{out}}/kill.tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(f"{{out}}/kill.tmp", f"{{out}}/kill")
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        opt.step()
    log.write(f"{{job.step}} {{time.time()!r}}\\n")
    if not job.in_place and rank == 0 and job.step % CKPT_EVERY == 0 and attempt == 0:
        torch.save({{"model": net.state_dict(), "optimizer": opt.state_dict(), "blob": blob.state_dict(),
                    "step": job.step}}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(STEP_TIME)
with open(f"{{out}}/recoveries-{{rank}}-{{os.getpid()}}.json", "w") as f:
    json.dump({{"script": script, "recoveries": [r.__dict__ for r in job.recoveries]}}, f)
job.close()
"""


def steps_of(out: str) -> dict[int, list[tuple[int, float]]]:
    """Per rank, every (steps done, time) any of its processes stamped after a step it did."""
    found: dict[int, list[tuple[int, float]]] = {}
    for path in glob.glob(os.path.join(out, "steps-*")):
        rank = int(path.rsplit("-", 2)[1])
        last = None
        for line in open(path).read().splitlines():
            done, at = line.split()
            if done != last:  # a step a lost peer broke is stamped again with the same count: not a step done
                found.setdefault(rank, []).append((int(done), float(at)))
            last = done
    return found


def phases(out: str, kill: float, stamps: dict[int, list[tuple[int, float]]]) -> dict[str, float]:
    """In place: when each phase of the recovery ended, in seconds after the kill (the newcomer's
    phases prefixed "new", the survivors' "old", the latest survivor's)."""
    at: dict[str, float] = {}
    for line in open(os.path.join(out, "events.jsonl")).read().splitlines():
        ev = json.loads(line)
        name = {"exit": "agent: exit seen", "rendezvous": "agent: round opened", "spawn": "agent: forked"}
        if ev["event"] in name and ev["time"] > kill - 0.05 and name[ev["event"]] not in at:
            at[name[ev["event"]]] = ev["time"] - kill
        if ev["event"] == "recovered":
            at["agent: every rank in"] = ev["time"] - kill
    for path in glob.glob(os.path.join(out, "recoveries-*.json")):
        record = json.load(open(path))
        new = any(t > kill for _, t in record["script"])
        for r in record["recoveries"]:
            for mark, t in r["marks"]:
                key = f"{'new' if new else 'old'}: {mark}"
                at[key] = max(at.get(key, 0.0), t - kill)
        if new:
            at.update({f"new: {mark}": t - kill for mark, t in record["script"]})
    firsts = {r: min((t for d, t in s if t > kill and d == KILL_AT + 1), default=None) for r, s in stamps.items()}
    for r, t in firsts.items():
        key = "new: first step" if r == 1 else "old: first step"
        if t is not None:
            at[key] = max(at.get(key, 0.0), t - kill)
    return at


def one_job(tool: str, n: int, script: str, size: int, compiled: int, fresh: bool, timeout: float) -> dict:
    out = tempfile.mkdtemp(prefix="inplace-")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OMP_NUM_THREADS", None)
    if tool in NO_MEMORY:
        env["LAUNCHER_STATE_IN_MEMORY"] = "0"
    events = ["--events_file", os.path.join(out, "events.jsonl")] if tool.startswith("in place") else []
    cmd = [*TOOLS[tool], *events, "--nproc_per_node", str(n), "--max_restarts", "1"]
    if compiled == 2 and tool != "torchrun":  # the zygote imports the compiler once: each fork has it
        cmd += ["--preload-modules", COMPILER]
    cmd += [script, out, str(size), str(compiled), str(int(fresh and tool != "in place, zeroed"))]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    result: dict = {"tool": tool}
    try:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            _, err = p.communicate()
        result["rc"] = p.returncode
        if not os.path.exists(os.path.join(out, "kill")):
            result["error"] = "never killed: " + err.decode(errors="replace")[-300:]
            return result
        kill = float(open(os.path.join(out, "kill")).read())
        stamps = steps_of(out)
        before = sorted(t for done, t in stamps.get(0, []) if t < kill)
        step_time = statistics.median(b - a for a, b in zip(before, before[1:])) if len(before) > 2 else 0.0
        after = {r: [(d, t) for d, t in s if t > kill] for r, s in stamps.items()}
        # the steps done before the kill that run again, and the one in flight: rank 0's, after the kill
        result["again"] = len({d for d, _ in after.get(0, []) if d <= KILL_AT + 1})
        if len(after) == n and all(after.values()):
            result["back"] = max(min(t for _, t in s) for s in after.values()) - kill
            again = [min((t for d, t in s if d == KILL_AT + 1), default=None) for s in after.values()]
            if None not in again:
                result["lost"] = max(again) - kill - step_time
        for path in glob.glob(os.path.join(out, "recoveries-*.json")):
            for r in json.load(open(path))["recoveries"]:
                if r["received"]:
                    result["move"] = r["moving"]
                if r["sent"]:
                    result["gbps"] = r["sent"] / r["moving"] / 1e9 if r["moving"] else None
        if events:
            result["phases"] = phases(out, kill, stamps)
        return result
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        subprocess.run(["rm", "-rf", out])


def fmt(values: list, digits: int = 2, unit: str = " s") -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"never ({len(values)}/{len(values)})" if values else "–"
    text = f"{statistics.median(got):.{digits}f}{unit}"
    return text + (f", never {len(values) - len(got)}/{len(values)}" if len(got) < len(values) else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--configs",
        default="10,200,1000,compile,compile-pre",
        help="state sizes in MB, and/or compile (10 MB), compile-pre (the same, --preload-modules " + COMPILER + ")",
    )
    ap.add_argument(
        "--tools",
        default="inplace,zeroed,restart,torchrun",
        help="which of inplace, zeroed, inplace-nomemory (LAUNCHER_STATE_IN_MEMORY=0), restart, nomemory (a restart "
        "from the checkpoint file alone), torchrun",
    )
    ap.add_argument("--timeout", type=float, default=240.0, help="per job")
    args = ap.parse_args()
    named = {"compile": ("compile", 10, 1), "compile-pre": ("compile, compiler preloaded", 10, 2)}
    configs = [named[c] if c in named else (f"{c} MB", int(c), 0) for c in args.configs.split(",")]
    short = dict(zip(("inplace", "zeroed", "inplace-nomemory", "restart", "nomemory", "torchrun"), TOOLS))
    tools = [short[t] for t in args.tools.split(",")]
    rows: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        Path(script).write_text(WORKER)
        began = cpu_snapshot()
        for rep in range(args.reps):
            for name, size, compiled in configs:
                for tool in tools if rep % 2 == 0 else list(reversed(tools)):
                    r = one_job(tool, args.ranks, script, size, compiled, True, args.timeout)
                    rows.setdefault((name, tool), []).append(r)
                    shown = ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
                    print(f"rep {rep} {name}: {shown}", file=sys.stderr, flush=True)
        ended = cpu_snapshot()
    torch_version = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    print(
        f"# in place, {datetime.date.today()}, {revision()}, {os.cpu_count()} cores, torch "
        f"{torch_version.stdout.strip()}, {args.ranks} ranks, {args.reps} reps, other load "
        f"{other_load(began, ended):.2f} cores; kill in step {KILL_AT}, checkpoint every {CKPT_EVERY} (restarts)"
    )
    print()
    print(
        "| state | tool | kill → every rank stepping again | lost per failure | steps run again | newcomer's transfer |"
    )
    print("|---|---|---|---|---|---|")
    for name, _, _ in configs:
        for tool in tools:
            rs = [r for r in rows[(name, tool)] if "error" not in r]
            move = ""
            if tool.startswith("in place") and any("move" in r for r in rs):
                gbps = [r.get("gbps") for r in rs if r.get("gbps")]
                move = fmt([r.get("move") for r in rs], 3) + (f" ({statistics.median(gbps):.2f} GB/s)" if gbps else "")
            errors = len(rows[(name, tool)]) - len(rs)
            note = f" ({errors} failed to run)" if errors else ""
            back = [r.get("back") for r in rs]
            again = fmt([r.get("again") for r in rs], 0, "")
            print(
                f"| {name} | {tool}{note} | {fmt(back, 3)} | {fmt([r.get('lost') for r in rs], 3)} | {again} | {move} |"
            )
    print_phases(configs, rows)


def print_phases(configs: list, rows: dict) -> None:
    """In place: each phase's end, seconds after the kill (medians), one column per configuration and tool."""
    per = {
        f"{name}{tool[len('in place') :].replace(' (--preload)', '')}": [r["phases"] for r in got if "phases" in r]
        for name, _, _ in configs
        for tool in TOOLS
        if tool.startswith("in place") and (got := rows.get((name, tool)))
    }
    if not per:
        return
    seen = {k for runs in per.values() for p in runs for k in p}
    first = {
        k: min(statistics.median(p[k] for p in runs if k in p) for runs in per.values() if any(k in p for p in runs))
        for k in seen
    }
    print()
    print("In place, when each phase ended (s after the kill; new: the newcomer, old: the last survivor)")
    print()
    print("| phase | " + " | ".join(per) + " |")
    print("|---" * (len(per) + 1) + "|")
    for k in sorted(seen, key=first.get):
        cells = [
            fmt([p[k] for p in runs if k in p], 3, "") if any(k in p for p in runs) else "" for runs in per.values()
        ]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
