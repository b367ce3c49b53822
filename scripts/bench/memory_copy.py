"""The step's cost of the state's copy in memory (docs/memory.md): one process, a model of SIZE MB of
parameters trained with SGD (the kept state: its parameters), the same steps with and without
`memory.Memory.save` at each step's end, side by side; and the load a restart does.

    python scripts/bench/memory_copy.py --sizes 10 200 1000 --steps 8

Prints, per size: the median step without the copy, with it, the copy alone, and the load. One run,
no launcher: the copy is what a worker's step waits for; what a restart costs besides is the launcher's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from launcher.worker.inplace.memory import Memory

WIDTH = 2048  # a square layer of WIDTH x WIDTH floats: 16.8 MB


def model_of(mb: float) -> torch.nn.Module:
    layers = max(1, round(mb * 1e6 / (4 * WIDTH * WIDTH)))
    width = WIDTH if layers > 1 else max(64, int((mb * 1e6 / 4) ** 0.5))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()


def measure(mb: float, steps: int, folder: str) -> tuple[float, float, float, float, float]:
    model = model_of(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    x = torch.randn(4, model[0].in_features)
    memory = Memory(folder, 0, 1, "bench", 1)
    kept = {"model": model, "optimizer": optimizer}
    plain, copied, copies = [], [], []
    step(model, optimizer, x)  # warm: the gradients' memory exists
    for i in range(steps):
        began = time.perf_counter()
        step(model, optimizer, x)
        plain.append(time.perf_counter() - began)
        began = time.perf_counter()
        step(model, optimizer, x)
        middle = time.perf_counter()
        memory.save(kept, {"step": i + 1}, rnd=0)
        copied.append(time.perf_counter() - began)
        copies.append(time.perf_counter() - middle)
    began = time.perf_counter()
    memory.load(memory.held(0)[0], kept)
    load = time.perf_counter() - began
    return size, statistics.median(plain), statistics.median(copied), statistics.median(copies[1:] or copies), load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 200, 1000], help="MB of parameters")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dir", default="/dev/shm", help="where the copies go (the agent's folder is in /dev/shm)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.steps} steps each way")
    print(f"{'state':>9} {'step':>9} {'+copy':>9} {'slower':>7} {'copy':>9} {'GB/s':>6} {'load':>8}")
    for mb in args.sizes:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="launcher-bench-memory-") as folder:
            size, plain, copied, copy, load = measure(mb, args.steps, folder)
        print(
            f"{size:7.0f}MB {plain * 1e3:7.1f}ms {copied * 1e3:7.1f}ms {100 * (copied / plain - 1):6.1f}% "
            f"{copy * 1e3:7.1f}ms {size / 1e3 / copy:6.2f} {load:7.2f}s"
        )


if __name__ == "__main__":
    main()
