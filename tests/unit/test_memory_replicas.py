"""The replicas' state copied once per node (launcher/worker/inplace/memory.py), in process with a tmp
folder: where the job's DDP runs over the default group, only local rank 0's file holds the kept
parameters and optimizer state; another local rank's file holds its own part alone, its copy
of a step is whole only where local rank 0's file holds the same step of the same history, and it loads
the replicas from there and its own buffers from its own file. Without that DDP, each rank's whole."""

from __future__ import annotations

import logging
import os

import pytest
from support import needs

pytestmark = needs.torch
# imported by `group`, when the module runs, not at collection (support/needs.py)
torch = dist = DistributedDataParallel = HEADER = Memory = None


@pytest.fixture(scope="module", autouse=True)
def group():
    """A default process group of one rank (gloo, in process): what a DDP over it needs."""
    global torch, dist, DistributedDataParallel, HEADER, Memory
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from launcher.worker.inplace.memory import HEADER, Memory

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if made:
        dist.destroy_process_group()


def state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


class Rank:
    """One local rank of a node of two: the model (the same on both, DDP's replicas), its own buffers."""

    def __init__(self, folder: str, local_rank: int, ddp: bool = True, since: int = 0, rank: int | None = None):
        self.model, self.optimizer = state()
        # The rest of a model's state, outside the DDP (a frozen part): the same on every rank too.
        self.frozen = torch.nn.Linear(128, 128).requires_grad_(False)
        self.kept = {"model": self.model, "optimizer": self.optimizer, "frozen": self.frozen}
        self.ddp = DistributedDataParallel(self.model) if ddp else None
        rank = local_rank if rank is None else rank
        self.memory = Memory(folder, rank, 4, "job", local_rank, local_world=2, since=since)

    def step(self, index: int, rnd: int = 0) -> None:
        torch.manual_seed(index)  # the same batch on both: the same gradients, as after DDP's all-reduce
        self.optimizer.zero_grad()
        self.model(torch.randn(5, 256)).sum().backward()
        self.optimizer.step()
        # Each rank's own batch-norm statistics (DDP does not average them): set apart, per rank.
        self.model[1].running_mean.add_(self.memory.local_rank)
        self.memory.save(self.kept, {"step": index}, rnd, self.ddp)
        self.memory.wait()


def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer, dict]:
    """A new process's kept objects (before a load)."""
    model, optimizer = state()
    return model, optimizer, {"model": model, "optimizer": optimizer, "frozen": torch.nn.Linear(128, 128)}


def steps(memory: Memory, rnd: int = 0) -> list[int]:
    return [h.step for h in memory.held(rnd)]


def test_local_rank_0_alone_holds_the_replicas_and_another_rank_loads_them_with_its_own_buffers(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="launcher.worker.inplace.memory")
    lead, other = Rank(str(tmp_path), 0), Rank(str(tmp_path), 1)
    for index in (1, 2, 3):
        lead.step(index)
        other.step(index)
    params = sum(p.numel() * 4 for p in [*lead.model.parameters(), *lead.frozen.parameters()])
    sizes = {name: os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path)}
    assert sizes["state.0.1"] > params and sizes["state.1.1"] < params / 4, sizes  # no parameter bytes
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "a copy, two per node (the replicas' state once for the node's 2 ranks; " in lines[0]
    held = other.memory.held(0)
    assert [h.step for h in held] == [3, 2] and held[0].lead.endswith("state.0.1")
    fresh_model, fresh_optimizer, kept = fresh()
    got, _ = other.memory.load(held[0], kept)
    assert got["step"] == 3
    for key, value in fresh_model.state_dict().items():
        assert torch.equal(value, other.model.state_dict()[key]), key  # the replicas, and its own buffers
    assert not torch.equal(fresh_model[1].running_mean, lead.model[1].running_mean)
    assert torch.equal(kept["frozen"].weight, other.frozen.weight)
    for key, value in fresh_optimizer.state_dict()["state"][0].items():
        assert torch.equal(value, other.optimizer.state_dict()["state"][0][key]), key
    fresh_model, _, kept = fresh()
    lead.memory.load(lead.memory.held(0)[0], kept)
    for key, value in fresh_model.state_dict().items():
        assert torch.equal(value, lead.model.state_dict()[key]), key


def test_a_step_local_rank_0_holds_torn_or_not_at_all_is_not_held_by_another_rank(tmp_path):
    lead, other = Rank(str(tmp_path), 0), Rank(str(tmp_path), 1)
    for index in (1, 2):
        lead.step(index)
        other.step(index)
    lead.step(3)  # local rank 0 a step ahead: its step 1 overwritten, the other rank's step 3 not taken yet
    assert steps(lead.memory) == [3, 2] and steps(other.memory) == [2]
    other.step(3)
    assert steps(other.memory) == [3, 2]
    newest = lead.memory.held(0)[0].path
    with open(newest, "r+b") as f:  # local rank 0 killed in the middle of its copy: its header cleared
        f.write(bytes(HEADER.size))
    assert steps(other.memory) == [2]


def test_local_rank_0s_copy_from_another_history_is_not_paired(tmp_path):
    """A group restart in round 5 resumed elsewhere than from these copies: local rank 0 wrote its step 2
    again in the new history, the other rank's step 2 is the old history's: not one copy."""
    lead, other = Rank(str(tmp_path), 0), Rank(str(tmp_path), 1)
    for index in (1, 2):
        lead.step(index)
        other.step(index)
    again = Rank(str(tmp_path), 0, since=5)
    again.step(1, rnd=5)
    # Its step 1 went into the old step 1's half: the other rank's step 1 (old history) pairs with none.
    assert steps(other.memory, 5) == [2]
    again.step(2, rnd=5)
    assert steps(other.memory, 5) == []
    assert steps(Memory(str(tmp_path), 1, 4, "job", 1, local_world=2, since=5), 5) == []


def test_a_load_finds_local_rank_0s_copy_rewritten_since_it_was_held_and_refuses(tmp_path):
    lead, other = Rank(str(tmp_path), 0), Rank(str(tmp_path), 1)
    for index in (1, 2):
        lead.step(index)
        other.step(index)
    held = other.memory.held(0)
    lead.step(3)  # into the half of step 1
    lead.step(4)  # into step 2's half: the one held
    with pytest.raises(RuntimeError, match="changed while it was loaded"):
        other.memory.load(held[0], fresh()[2])


@pytest.mark.parametrize("how", ["no DDP", "a group of its own", "parameters it ignores", "one rank on the node"])
def test_without_a_ddp_over_the_default_group_each_rank_copies_its_whole_state(tmp_path, how):
    lead, other = Rank(str(tmp_path), 0, ddp=how != "no DDP"), Rank(str(tmp_path), 1, ddp=how != "no DDP")
    if how == "a group of its own":
        own = dist.new_group([0])
        lead.ddp = DistributedDataParallel(lead.model, process_group=own)
        other.ddp = DistributedDataParallel(other.model, process_group=own)
    if how == "parameters it ignores":  # an expert's per rank, say: DDP leaves them to the script
        for one in (lead, other):
            one.model._ddp_params_and_buffers_to_ignore = ["2.bias"]
            one.ddp = DistributedDataParallel(one.model)
    if how == "one rank on the node":
        other.memory.local_world = lead.memory.local_world = 1
    for index in (1, 2):
        lead.step(index)
        other.step(index)
    params = sum(p.numel() * 4 for p in lead.model.parameters())
    assert os.path.getsize(tmp_path / "state.1.1") > params
    held = other.memory.held(0)
    assert [h.step for h in held] == [2, 1] and held[0].lead == ""
    os.remove(tmp_path / "state.0.0")
    os.remove(tmp_path / "state.0.1")
    assert steps(other.memory) == [2, 1]  # its own whole: local rank 0's files are not needed


def test_a_renamed_rank_goes_on_from_its_old_ranks_copy_and_that_nodes_local_rank_0s(tmp_path):
    """LAUNCHER_STATE_IN_MEMORY=any: this node ran ranks 2 and 3, now 0 and 1; rank 1 (local rank 1) goes on
    from rank 3's copy, whose replicas the node's local rank 0 wrote as rank 2."""
    lead, other = Rank(str(tmp_path), 0, rank=2), Rank(str(tmp_path), 1, rank=3)
    for index in (1, 2):
        lead.step(index)
        other.step(index)
    renamed = Memory(str(tmp_path), 1, 4, "job", 1, anywhere=True, local_world=2)
    held = renamed.held(1)
    assert [(h.step, h.meta["rank"]) for h in held] == [(2, 3), (1, 3)] and held[0].lead.endswith("state.2.0")
    fresh_model, _, kept = fresh()
    renamed.load(held[0], kept)
    for key, value in fresh_model.state_dict().items():
        assert torch.equal(value, other.model.state_dict()[key]), key
