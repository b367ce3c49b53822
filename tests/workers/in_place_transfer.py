"""Rank 0 sends its state to rank 1 with launcher.worker.inplace.transfer; rank 1 receives into a
fresh torch.empty tensor of several pages (faulted in first), into a non-contiguous one, and into
none (a new tensor), then prints `received ok` when every value arrived. argv: RANK PORT."""

import sys

import torch
import torch.distributed as dist

from launcher.worker.inplace import transfer

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)


class Box:
    def __init__(self, **tensors):
        self.tensors = tensors

    def state_dict(self):
        return dict(self.tensors)

    def load_state_dict(self, state):
        self.tensors = dict(state)


n = 10 * 1024 + 3  # float32: ten pages and a bit
if rank == 0:
    big, wide = torch.arange(n, dtype=torch.float32), torch.arange(6000.0).reshape(2, 3000)
    box = Box(big=big, wide=wide, new=torch.ones(5000))
    transfer.send({"box": box}, {"step": 7}, (1,), torch.device("cpu"))
else:
    fresh, wide = torch.empty(n), torch.empty(3000, 2).t()  # the second is not contiguous
    box = Box(big=fresh, wide=wide, new=torch.empty(3))  # `new` has another shape: received into a new tensor
    step = transfer.receive({"box": box}, 0, torch.device("cpu"))["step"]
    got = box.tensors
    assert step == 7 and got["big"] is fresh and torch.equal(fresh, torch.arange(n, dtype=torch.float32))
    assert torch.equal(got["wide"], torch.arange(6000.0).reshape(2, 3000)) and torch.equal(got["new"], torch.ones(5000))
    print("received ok", flush=True)
dist.destroy_process_group()
