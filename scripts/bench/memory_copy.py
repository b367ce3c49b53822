"""The step's cost of the state's copy in memory (docs/memory.md): one process, a model of SIZE MB of
parameters trained with SGD (the kept state: its parameters), the same steps without the copy ("step"),
with the copy the step waits for at its end ("+sync": how it was before the copy went beside the step),
and with the copy beside the next step ("+beside": what `Job` does, the backward and the optimizer's
step waiting for the copy in flight); and the load a restart does.

    python scripts/bench/memory_copy.py --sizes 10 200 1000 --steps 2 --blocks 6 [--threads 1] [--frozen]

`--frozen`: every layer but the last is frozen (a fine-tune's base, kept, changed by no step): what each
copy writes is the last layer alone once each of the two files holds the base.

Blocks of `--steps` steps of each kind in turn, `--blocks` times (a block's first step beside is not
counted: no copy beside it yet). Prints, per size: the median step of each kind and how much slower; the
copy alone (in its thread: longer beside a step that uses the same cores); the step's own part of a
copy beside it (`save` until it returns: the structure, the small tensors copied at once, the thread's
start); the median wait for the copy in the next step; the load; the training thread's own CPU time
per step without the copy and beside it (all of the step's with `--threads 1`: what the step itself
does, whatever else runs on the host's cores). One run, no launcher: what a restart costs besides is
the launcher's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from launcher.worker.inplace.memory import Memory

WIDTH = 2048  # a square layer of WIDTH x WIDTH floats: 16.8 MB
KINDS = ("plain", "sync", "beside")


def model_of(mb: float) -> torch.nn.Module:
    layers = max(1, round(mb * 1e6 / (4 * WIDTH * WIDTH)))
    width = WIDTH if layers > 1 else max(64, int((mb * 1e6 / 4) ** 0.5))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()


def measure(mb: float, steps: int, blocks: int, batch: int, folder: str, frozen: bool) -> tuple:
    model = model_of(mb)
    if frozen and len(model) > 1:
        model[:-1].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    x = torch.randn(batch, model[0].in_features)
    memory = Memory(folder, 0, 1, "bench", 1)
    kept = {"model": model, "optimizer": optimizer}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}  # the training thread's own CPU time
    copies, waits, saves = [], [], []
    step(model, optimizer, x)  # warm: the gradients' memory exists
    done = 0
    for block in range(blocks):
        for kind in KINDS[block % 3 :] + KINDS[: block % 3]:  # each kind first in turn
            memory.wait()  # no copy of another block's beside this one's steps
            memory.beside = kind == "beside"  # else the copy is made at the step's end, the step waiting
            for i in range(steps + 1):
                waited, began, used = memory.waited, time.perf_counter(), time.thread_time()
                step(model, optimizer, x)
                if kind != "plain":
                    done += 1
                    saving = time.perf_counter()
                    memory.save(kept, {"step": done}, rnd=0)
                    saved = time.perf_counter() - saving
                took, used = time.perf_counter() - began, time.thread_time() - used
                if i or kind != "beside":  # a block's first step beside: no copy beside it yet
                    times[kind].append(took)
                    cpu[kind].append(used)
                if i and kind == "beside":
                    waits.append(memory.waited - waited)
                    saves.append(saved)
                if kind != "plain" and i > 1:
                    copies.append(memory.copied)  # the copy before this step's, done by now
    memory.wait()
    began = time.perf_counter()
    memory.load(memory.held(0)[0], kept)
    load = time.perf_counter() - began
    medians = {kind: statistics.median(t) for kind, t in times.items()}
    medians.update({f"cpu {kind}": statistics.median(t) for kind, t in cpu.items()})
    return size, medians, statistics.median(copies), statistics.median(saves), statistics.median(waits), load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 200, 1000], help="MB of parameters")
    parser.add_argument("--steps", type=int, default=2, help="steps per block")
    parser.add_argument("--blocks", type=int, default=8, help="blocks of each kind, in turn")
    parser.add_argument("--batch", type=int, default=4, help="rows per step (4: a step bound by memory bandwidth)")
    parser.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: its own choice)")
    parser.add_argument("--frozen", action="store_true", help="every layer but the last frozen (a fine-tune)")
    parser.add_argument("--dir", default="/dev/shm", help="where the copies go (the agent's folder is in /dev/shm)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # 1 on a 2-core host: a core left for the copy, as a GPU's step leaves
    n = args.steps * args.blocks
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {n} steps of each kind")
    print(
        f"{'state':>9} {'step':>9} {'+sync':>9} {'slower':>7} {'+beside':>9} {'slower':>7} "
        f"{'copy':>9} {'save':>8} {'wait':>8} {'load':>7} {'cpu':>8} {'+beside':>8}"
    )
    for mb in args.sizes:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="launcher-bench-memory-") as folder:
            size, t, copy, save, wait, load = measure(mb, args.steps, args.blocks, args.batch, folder, args.frozen)
        plain = t["plain"]
        print(
            f"{size:7.0f}MB {plain * 1e3:7.1f}ms {t['sync'] * 1e3:7.1f}ms {100 * (t['sync'] / plain - 1):6.1f}% "
            f"{t['beside'] * 1e3:7.1f}ms {100 * (t['beside'] / plain - 1):6.1f}% {copy * 1e3:7.1f}ms "
            f"{save * 1e3:6.1f}ms {wait * 1e3:6.1f}ms {load:6.2f}s {t['cpu plain'] * 1e3:6.1f}ms "
            f"{t['cpu beside'] * 1e3:6.1f}ms"
        )


if __name__ == "__main__":
    main()
