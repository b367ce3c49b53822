"""A tiny DDP job (gloo, CPU) that ends as pytorch/examples' ddp-tutorial-series does: it trains, calls
`destroy_process_group()` and returns from `main`, so the DDP model (its Reducer, and through it the
process group) is freed when `main` returns. Prints whether the process group outlived its model
(as it does in a spawned worker) and `done`. DDP_STEPS: steps to train (default 20)."""

import os
import time
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self):
        self.model = DDP(torch.nn.Linear(20, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.optimizer.zero_grad()
            self.model(torch.rand(32, 20)).sum().backward()
            self.optimizer.step()


def main() -> weakref.ref:
    dist.init_process_group("gloo")
    group = weakref.ref(dist.group.WORLD)
    Trainer().train(int(os.environ.get("DDP_STEPS", "20")))
    dist.destroy_process_group()
    return group


if __name__ == "__main__":
    group = main()
    print(f"group outlived its model: {group() is not None}", flush=True)
    print(f"done {time.time():.6f}", flush=True)  # when its exit begins: scripts/bench/worker_exit.py
