"""One gloo all_reduce over env://, then return without destroy_process_group (torch's teardown race).

The shape of pytorch's launcher test script for `--init-method=env://`: each rank sums a one-hot
vector and checks the world size. gloo's thread may still be releasing the collective when the
interpreter finalises (pytorch#190489). Prints `done RANK`.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
vec = torch.zeros(dist.get_world_size())
vec[dist.get_rank()] = 1
dist.all_reduce(vec)
assert int(vec.sum().item()) == dist.get_world_size(), vec
print(f"done {os.environ['RANK']}", flush=True)
