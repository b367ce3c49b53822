"""A rank's copies in memory (launcher/worker/inplace/memory.py), written and read back by real objects in
real files: the two newest steps are held, a torn copy is never loaded, another job's or world's copy is
refused in one line, and what is loaded is the state that was copied (a later change does not reach it),
also when the copy runs beside the next step's forward (its backward and its optimizer's step wait for
it; a change that did not wait for it tears the copy, which is then never loaded)."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
from support import needs

pytestmark = needs.torch
torch = HEADER = Memory = None  # imported when the module runs, not at collection (support/needs.py)


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch, HEADER, Memory
    import torch

    from launcher.worker.inplace.memory import HEADER, Memory


def state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()


def gate(monkeypatch, memory: Memory) -> threading.Event:
    """`memory`'s copies wait for the event before they copy their tensors."""
    opened = threading.Event()
    copy = memory._copy

    def gated(*args):
        assert opened.wait(30)
        copy(*args)

    monkeypatch.setattr(memory, "_copy", gated)
    return opened


def meta(step: int) -> dict:
    return {"step": step, "rng": ("after", step, {"torch": torch.get_rng_state()})}


def test_the_two_newest_steps_are_held_and_load_back_what_was_copied(tmp_path):
    model, optimizer = state()
    memory = Memory(str(tmp_path), rank=1, world=2, run_id="job", local_rank=1)
    copied = {}
    for step in (1, 2, 3):
        train(model, optimizer)
        memory.save({"model": model, "optimizer": optimizer}, meta(step), rnd=0)
        copied[step] = {k: v.clone() for k, v in model.state_dict().items()}
    assert [h.step for h in memory.held(0)] == [3, 2]  # double-buffered: step 1's copy was overwritten
    train(model, optimizer)  # the live state moves on; the copy does not
    fresh_model, fresh_optimizer = state()
    got, nbytes = Memory(str(tmp_path), 1, 2, "job", 1).load(
        memory.held(0)[1], {"model": fresh_model, "optimizer": fresh_optimizer}
    )
    assert got["step"] == 2 and nbytes > 0
    for key, value in fresh_model.state_dict().items():
        assert torch.equal(value, copied[2][key]), key
    assert int(fresh_optimizer.state_dict()["state"][0]["step"]) == 2
    train(fresh_model, fresh_optimizer)  # the loaded state is the job's own memory: a later copy leaves it alone
    memory.save({"model": model, "optimizer": optimizer}, meta(4), rnd=0)
    assert [h.step for h in memory.held(0)] == [4, 3]


def test_a_copy_torn_while_it_was_written_is_never_loaded(tmp_path):
    model, optimizer = state()
    memory = Memory(str(tmp_path), 0, 1, "job", 0)
    for step in (1, 2):
        memory.save({"model": model, "optimizer": optimizer}, meta(step), rnd=0)
    newest = memory.held(0)[0].path
    with open(newest, "r+b") as f:  # a rank killed in the middle of its copy: the header cleared, not yet written
        f.write(bytes(HEADER.size))
    assert [h.step for h in memory.held(0)] == [1]


def test_another_jobs_or_worlds_copy_is_refused_in_one_line(tmp_path, caplog):
    model, optimizer = state()
    Memory(str(tmp_path), 0, 2, "job-a", 0).save({"model": model}, meta(7), rnd=0)
    caplog.set_level(logging.WARNING, logger="launcher.worker.inplace.memory")
    assert Memory(str(tmp_path), 0, 2, "job-b", 0).held(0) == []
    assert Memory(str(tmp_path), 0, 4, "job-a", 0).held(0) == []
    assert Memory(str(tmp_path), 0, 2, "job-a", 0).held(0)[0].step == 7
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "another job's (run id 'job-a', this one 'job-b'): ignored" in lines[0]
    assert "from another world (rank 0 of 2, this one rank 0 of 4): ignored" in lines[1]
    assert sorted(os.listdir(tmp_path)) == ["state.0.1"]


def test_the_copy_runs_beside_the_next_steps_forward_and_its_backward_waits_for_it(tmp_path, monkeypatch):
    model, optimizer = state()
    train(model, optimizer)
    memory = Memory(str(tmp_path), 0, 1, "job", 0)
    opened = gate(monkeypatch, memory)
    memory.save({"model": model, "optimizer": optimizer}, meta(1), rnd=0)
    copied = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    optimizer.zero_grad()
    loss = model(torch.randn(5, 4)).sum()  # the next step's forward, beside the copy: batch-norm statistics move
    threading.Timer(0.5, opened.set).start()  # the copy in flight until then
    began = time.monotonic()
    loss.backward()  # its first gradient waits: no peer's all-reduce completes before this rank's copy is whole
    assert time.monotonic() - began >= 0.4, "the backward did not wait for the copy in flight"
    optimizer.step()
    fresh_model, fresh_optimizer = state()
    got, _ = memory.load(memory.held(0)[0], {"model": fresh_model, "optimizer": fresh_optimizer})
    assert got["step"] == 1
    for key, value in fresh_model.state_dict().items():  # the step's end, not the next step's forward
        assert torch.equal(value, copied[key]), key
    for key, value in fresh_optimizer.state_dict()["state"][0].items():
        assert torch.equal(value, moments[key]), key


def test_a_kept_tensor_changed_beside_its_copy_tears_it_and_the_step_waits_from_then_on(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="launcher.worker.inplace.memory")
    model, optimizer = state()
    kept = {"model": model, "optimizer": optimizer}
    memory = Memory(str(tmp_path), 0, 1, "job", 0)
    train(model, optimizer)
    memory.save(kept, meta(1), rnd=0)
    train(model, optimizer)
    opened = gate(monkeypatch, memory)
    memory.save(kept, meta(2), rnd=0)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # not the kept optimizer's step: nothing waits for the copy
    opened.set()
    assert [h.step for h in memory.held(0)] == [1]  # step 2's copy is torn: never loaded
    assert any("changed outside the kept optimizers' step" in r.getMessage() for r in caplog.records)
    train(model, optimizer)
    memory.save(kept, meta(3), rnd=0)  # into the torn half, whole once save returns (read by another reader)
    assert [h.step for h in Memory(str(tmp_path), 0, 1, "job", 0).held(0)] == [3, 1]


def test_a_rank_the_node_ran_as_another_goes_on_from_that_ranks_copy_when_told(tmp_path, caplog):
    """The re-formed group gave this node other ranks: its local rank 0, rank 2 of 4 before, is rank 0
    now; its own name holds an older copy, the node's local rank 0 wrote a newer as rank 2. Exact (the
    default), it holds its own alone; LAUNCHER_STATE_IN_MEMORY=any, rank 2's, said in one line."""
    model, optimizer = state()
    Memory(str(tmp_path), 0, 4, "job", 0).save({"model": model}, meta(3), rnd=0)  # an older own copy
    before = Memory(str(tmp_path), 2, 4, "job", 0)
    for step in (6, 7):
        before.save({"model": model}, meta(step), rnd=1)
    Memory(str(tmp_path), 3, 4, "job", 1).save({"model": model}, meta(9), rnd=1)  # another local rank's
    Memory(str(tmp_path), 1, 2, "job", 0).save({"model": model}, meta(9), rnd=1)  # another world's
    caplog.set_level(logging.WARNING, logger="launcher.worker.inplace.memory")
    assert [h.step for h in Memory(str(tmp_path), 0, 4, "job", 0).held(2)] == [3]  # exact: its own alone
    held = Memory(str(tmp_path), 0, 4, "job", 0, anywhere=True).held(2)
    assert [(h.step, h.meta["rank"]) for h in held] == [(7, 2), (6, 2)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "local rank 0 last ran as rank 2: resuming from that rank's copy" in lines[0], lines
    assert [h.step for h in Memory(str(tmp_path), 2, 4, "job", 0).held(2)] == [7, 6]  # its own: no line
    assert len(caplog.records) == 1


def test_a_frozen_part_is_written_once_per_half_and_loaded_as_it_is(tmp_path):
    """A fine-tune's frozen part (a kept module no step changes) is not copied at every step: each half
    holds it from its first whole copy on; what changes is written, and a change to it is written again."""
    model, optimizer = state()
    frozen = torch.nn.Linear(256, 256).requires_grad_(False)  # 257 kB, far more than the trained part
    kept = {"model": model, "optimizer": optimizer, "frozen": frozen}
    memory = Memory(str(tmp_path), 0, 1, "job", 0)
    written = []
    for step in range(1, 6):
        train(model, optimizer)
        memory.save(kept, meta(step), rnd=0)
        memory.wait()
        written.append(memory.written)
    size = sum(p.numel() * 4 for p in frozen.parameters())
    assert written[0] > size and written[1] > size  # each half's first copy holds it
    assert written[2:] == [written[0] - size] * 3, written  # then only what the steps changed
    before = frozen.weight.clone()
    with torch.no_grad():
        frozen.weight[0, 0] = 7.0  # an in-place change: its version moves, it is written again
    memory.save(kept, meta(6), rnd=0)
    memory.wait()
    assert memory.written == written[2] + frozen.weight.numel() * 4  # the weight again, not the bias
    for step in (6, 5):
        fresh_model, fresh_optimizer = state()
        fresh = torch.nn.Linear(256, 256).requires_grad_(False)
        got, _ = memory.load(
            next(h for h in memory.held(0) if h.step == step),
            {"model": fresh_model, "optimizer": fresh_optimizer, "frozen": fresh},
        )
        assert got["step"] == step and torch.equal(fresh.bias, frozen.bias)
        assert torch.equal(fresh.weight, frozen.weight if step == 6 else before), step


def test_a_copy_in_flight_gives_up_once_a_peer_is_lost_and_the_step_before_stands(tmp_path, monkeypatch):
    """In place, a lost peer sets the job's event: the copy beside the step stops at its next chunk (the
    backward waiting for it would hold the recovery, and it would share the cores with the transfer)."""
    model, optimizer = state()
    kept, lost = {"model": model, "optimizer": optimizer}, threading.Event()
    memory = Memory(str(tmp_path), 0, 1, "job", 0, lost=lost)
    train(model, optimizer)
    memory.save(kept, meta(1), rnd=0)
    train(model, optimizer)
    opened = gate(monkeypatch, memory)
    memory.save(kept, meta(2), rnd=0)  # in flight, held at the gate
    lost.set()
    opened.set()
    memory.wait()
    assert [h.step for h in memory.held(0)] == [1]  # step 2's copy given up: never loaded
    lost.clear()
    train(model, optimizer)
    memory.save(kept, meta(3), rnd=0)
    memory.wait()
    assert [h.step for h in memory.held(0)] == [3, 1]
