"""The buckets DDP rebuilds after its first step, as `ddp.Recorder` predicts them from the order the
gradients became ready: what a DDP made after a recovery starts with, so its first step sums as the
undisturbed run's did (launcher/worker/inplace/ddp.py)."""

from __future__ import annotations

import datetime
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from launcher.worker.inplace import ddp  # noqa: E402


@pytest.fixture()
def one_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def models():
    yield (
        "sequential with batch norm",
        nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)),
        {},
    )
    # several buckets: a 1 KB first bucket and 4 KB after it
    big = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)], nn.Linear(32, 3))
    yield "several buckets", big, {"bucket_cap_mb": 4096 / 2**20}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [name for name, _, _ in models()])
def test_the_recorder_predicts_the_buckets_ddp_rebuilds(one_rank, name):
    module, kwargs = next((m, k) for n, m, k in models() if n == name)
    model = DistributedDataParallel(module, **kwargs)
    recorder = ddp.Recorder(model)
    before = ddp.zeroed_layout(model)
    for _ in range(2):  # the rebuild happens at the second forward
        model(torch.randn(4, 8 if name.startswith("seq") else 32)).sum().backward()
    assert recorder.layout() == ddp.zeroed_layout(model) != before
    assert len(recorder.layout()) > (2 if name == "several buckets" else 0)
    again = ddp.make(module, True, recorder.layout(), **kwargs)
    assert ddp.zeroed_layout(again) == recorder.layout()  # made again, it starts with them
