"""The buckets DDP rebuilds after its first step, as `ddp.Recorder` predicts them from the order the
gradients became ready: what a DDP made after a recovery starts with, so its first step sums as the
undisturbed run's did (launcher/worker/inplace/ddp.py)."""

from __future__ import annotations

import datetime

import pytest
from support import needs

pytestmark = needs.torch
MODELS = ("sequential with batch norm", "several buckets")


@pytest.fixture()
def one_rank():
    import torch.distributed as dist  # here, not at collection (support/needs.py)

    # port 0: the store binds a port itself (a port picked and then released may be taken before it binds)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def built(name: str):
    """(the module, DDP's keyword arguments, its input's width) for one of MODELS."""
    from torch import nn

    if name == "sequential with batch norm":
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)), {}, 8
    # several buckets: a 1 KB first bucket and 4 KB after it
    big = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)], nn.Linear(32, 3))
    return big, {"bucket_cap_mb": 4096 / 2**20}, 32


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", MODELS)
def test_the_recorder_predicts_the_buckets_ddp_rebuilds(one_rank, name):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from launcher.worker.inplace import ddp

    module, kwargs, width = built(name)
    model = DistributedDataParallel(module, **kwargs)
    recorder = ddp.Recorder(model)
    before = ddp.zeroed_layout(model)
    for _ in range(2):  # the rebuild happens at the second forward
        model(torch.randn(4, width)).sum().backward()
    assert recorder.layout() == ddp.zeroed_layout(model) != before
    assert len(recorder.layout()) > (2 if name == "several buckets" else 0)
    again = ddp.make(module, True, recorder.layout(), **kwargs)
    assert ddp.zeroed_layout(again) == recorder.layout()  # made again, it starts with them
