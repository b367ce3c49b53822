"""--recovery in-place in process: the flag, the accountant's view of an in-place round, and the
state transfer's pure parts (what is sent ahead of the tensors, buckets, receiving in place)."""

from __future__ import annotations

import inspect
import os

import pytest
from support import needs

from launcher.config import from_flags
from launcher.errors import ConfigError
from launcher.parsers import parse_recovery
from launcher.spec import RecoveryMode
from launcher.telemetry.accounting import Accountant
from launcher.worker.inplace import keys

pytestmark = needs.torch
torch = dist = compat = transfer = None  # imported when the module runs, not at collection (support/needs.py)


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch, dist, compat, transfer
    import torch
    import torch.distributed as dist

    from launcher.worker.inplace import compat, transfer


def test_recovery_defaults_to_restart_and_takes_in_place():
    assert parse_recovery(None, 1, {}) is RecoveryMode.RESTART
    assert parse_recovery("in_place", 1, {}) is RecoveryMode.IN_PLACE
    assert parse_recovery("in-place", 4, {}) is RecoveryMode.IN_PLACE  # across nodes too
    config = from_flags(training_script=__file__, recovery="in-place", in_place_timeout="5", environ={})
    assert (config.recovery, config.in_place_timeout) == (RecoveryMode.IN_PLACE, 5.0)


@pytest.mark.parametrize(
    ("text", "nodes", "environ", "says"),
    [
        ("sideways", 1, {}, "is not a mode; use one of restart, in-place"),
        ("in-place", 1, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, "unset it"),
    ],
)
def test_recovery_refuses_what_it_cannot_do_in_one_line(text, nodes, environ, says):
    with pytest.raises(ConfigError, match=says):
        parse_recovery(text, nodes, environ)


def test_an_in_place_round_waits_for_the_replacement_alone_and_ends_with_every_rank(tmp_path):
    now = [100.0]
    files = {r: tmp_path / f"p{r}" for r in range(3)}
    acc = Accountant(lambda: [(r, str(p)) for r, p in files.items()], clock=lambda: now[0])

    def steps(ranks, n: int, at: float) -> None:
        now[0] = at
        for r in ranks:
            files[r].write_text(f"{n:20d}\n")
            os.utime(files[r], (at, at))
        acc.tick()

    acc("rendezvous", {"cause": "start"})
    for r in range(3):
        acc("spawn", {"rank": r})
    acc("running", {"round": 0, "restarts": 0, "group_rank": 0, "group_world_size": 1})
    for n in range(1, 11):
        steps(range(3), n, 100.0 + n)
    now[0] = 110.5
    acc("exit", {"rank": 2, "returncode": -9, "collateral": False})
    acc("rendezvous", {"cause": "in_place"})
    acc("spawn", {"rank": 2})
    acc("running", {"round": 1, "restarts": 1, "group_rank": 0, "group_world_size": 1, "in_place": True})
    steps(range(3), 11, 111.0)  # the replacement received step 10 and did the step in flight
    for r in (0, 2):
        acc("exit", {"rank": r, "returncode": 0, "collateral": False})
    assert acc.ledger.window is None  # training: the failure window closed at the replacement's first step
    now[0] = 112.0
    acc("exit", {"rank": 1, "returncode": 0, "collateral": False})
    b = acc.finish()
    assert (b.restarts, b.redone_steps, b.restart) == (1, 0, 0.5)


def test_the_structure_sent_ahead_names_each_tensor_and_buckets_pack_small_ones():
    state = {"w": torch.ones(2, 3), "inner": [torch.zeros(4, dtype=torch.int64), 7], "lr": 0.1}
    tensors: list[torch.Tensor] = []
    stripped = transfer.strip(state, tensors)
    assert stripped["w"] == transfer.Slot(0, (2, 3), torch.float32, "cpu") and stripped["lr"] == 0.1
    assert transfer._fill(stripped, tensors)["inner"][0] is tensors[1]
    big = torch.empty(transfer.BUCKET // 4 + 1)  # over a bucket: alone
    small = [torch.empty(10), torch.empty(10), torch.empty(10, dtype=torch.int64), big, torch.empty(3)]
    assert transfer._buckets(small) == [[0, 1], [2], [3], [4]]


def test_a_receiver_gets_the_tensors_into_its_own_where_they_fit():
    own = {"w": torch.zeros(2, 3), "b": torch.zeros(5), "state": {0: {"buf": torch.zeros(4)}}}
    sent = transfer.strip({"w": torch.ones(2, 3), "b": torch.ones(6), "state": {0: {"buf": torch.ones(4)}}}, [])

    class Kept:
        def state_dict(self) -> dict:
            return own

    slots, targets = transfer.landing({"state": {"kept": sent}, "meta": {}}, {"kept": Kept(), "other": Kept()})
    assert [s.index for s in slots] == [0, 1, 2] and slots[1].shape == (6,)
    assert targets[0] is own["w"] and targets[1] is None and targets[2] is own["state"][0]["buf"]


def test_the_keys_of_a_round_live_under_its_own_prefix():
    assert keys.group_prefix(3) == "launcher/inplace/3/pg" and keys.opened(3).startswith("launcher/inplace/3/")


def test_the_workers_memory_folder_falls_back_to_the_run_folder_without_dev_shm(tmp_path):
    from launcher.agent import slots

    path = slots.make("job/1", str(tmp_path), shm=str(tmp_path / "no-shm"))
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith(f"launcher-job_1-{os.getpid()}-")
    assert os.stat(path).st_mode & 0o777 == 0o700
    (tmp_path / path / "0").write_text("state")
    slots.remove(path)
    slots.remove(path)  # gone already: nothing to do
    assert not os.path.exists(path)


def test_a_ranks_record_reads_back_whole_and_a_torn_write_leaves_the_one_before(tmp_path):
    from launcher.worker.inplace import rng, slots

    sent: list[bytes] = []
    slot = slots.Slot(str(tmp_path), 3, mirror=sent.append)
    first = {"afters": {4: rng.get()}, "buffers": {4: {"bn.mean": torch.arange(3.0), "bn.n": torch.tensor(7)}}}
    slot.write(first)
    got = slots.Slot(str(tmp_path), 3).read()
    assert torch.equal(got["afters"][4]["torch"], first["afters"][4]["torch"])
    mean, n = got["buffers"][4]["bn.mean"], got["buffers"][4]["bn.n"]
    assert torch.equal(mean, torch.arange(3.0)) and (n.dtype, n.item()) == (torch.int64, 7)
    assert slots.load(sent[-1])["buffers"][4]["bn.n"].item() == 7  # the store's copy reads back the same
    # a rank killed between the record's half and the header: the header still names the whole one
    header = (tmp_path / "rank3").read_bytes()[: slots.HEADER.size]
    slot.write({"afters": {5: rng.get()}, "buffers": {}})
    with open(tmp_path / "rank3", "r+b") as f:
        f.write(header)
    assert slots.covers(slots.Slot(str(tmp_path), 3).read()) == (4,)
    slot.finished(2)
    assert os.path.exists(keys.finished_file(str(tmp_path), 2))


def test_ddp_is_made_with_what_this_torch_takes_in_every_round():
    """`compat.ddp_kwargs`: init_sync where DDP takes it (2.13), none where not (2.4.1: a TypeError)."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for first in (True, False):  # the job's first round, and one after a recovery
            DistributedDataParallel(torch.nn.Linear(2, 2), **compat.ddp_kwargs(first))
    finally:
        dist.destroy_process_group()
    takes = "init_sync" in inspect.signature(DistributedDataParallel.__init__).parameters
    assert compat.ddp_kwargs(False) == ({"init_sync": False} if takes else {})


def test_state_sharded_across_ranks_is_refused_in_one_line():
    """A replacement is rebuilt from a replica of the whole state: FSDP, DTensor parameters and ZeRO cannot be."""
    from launcher.worker.inplace import ddp

    class FullyShardedDataParallel(torch.nn.Module):  # what FSDP (1) is named, as the check reads it
        pass

    ddp.refuse_sharded("keep(model=...)", torch.nn.Linear(2, 2))  # a replicated module: fine
    with pytest.raises(SystemExit) as e:
        ddp.refuse_sharded("keep(model=...)", FullyShardedDataParallel())
    said = str(e.value)
    assert "\n" not in said and said.startswith("launcher: keep(model=...): FullyShardedDataParallel shards")
    assert said.endswith("use --recovery restart")


def test_a_restart_resumes_at_the_newest_step_every_rank_holds_and_elsewhere_only_when_told():
    assert transfer.resumed_at([{5, 4}, {5, 4}, {4, 3}], anywhere=False) == 4  # a rank a step behind: their common one
    assert transfer.resumed_at([{5, 4}, set(), {5, 4}], anywhere=False) == -1  # a node lost whole: the script's state
    assert transfer.resumed_at([{5, 4}, set(), {5, 4}], anywhere=True) == 5  # sent to the rank without a copy
    assert transfer.resumed_at([set(), set()], anywhere=True) == -1  # the job's first round
    # A node lost whole, its ranks' own streams and buffers in the store: exact from the others' copies
    assert transfer.resumed_at([{5, 4}, set(), {5, 4}], False, [set(), {6, 5}, set()]) == 5
    assert transfer.resumed_at([{5, 4}, set(), {5, 4}], False, [set(), {4, 3}, set()]) == 4  # its record behind
    assert transfer.resumed_at([{5, 4}, set(), {5, 4}], False, [set(), {7, 6}, set()]) == -1  # none in common
    assert transfer.resumed_at([set(), set()], False, [{5}, {5}]) == -1  # records alone: no state to go on from


def test_a_record_covers_the_steps_it_holds_both_streams_and_buffers_at():
    from launcher.worker.inplace import slots

    assert slots.covers(None) == () and slots.covers({}) == ()
    assert slots.covers({"afters": {5: 0, 6: 0}, "buffers": {6: {}, 5: {}}}) == (6, 5)
    assert slots.covers({"afters": {5: 0, 6: 0}, "buffers": {6: {}}}) == (6,)  # no buffers at 5: not there


def test_a_group_restarts_records_learn_the_buffers_a_step_changes():
    from launcher.worker.inplace.step import Snapshot

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    model.register_buffer("mask", torch.ones(4))  # a buffer no step changes (a causal mask, a table)
    snap = Snapshot()
    snap.watch([model])
    assert snap.moving(model.mask)  # before a step is seen: every buffer, assumed to
    model(torch.randn(3, 2))  # a step's forward: the batch-norm statistics move
    snap.watch([model])
    assert (
        not snap.moving(model.mask) and snap.moving(model[1].running_mean) and snap.moving(model[1].num_batches_tracked)
    )
