"""What the protocol keeps in the shared store: the key layout (one place, `Keys`; agents of one job
and `launcher status` read the same names) and the records under those keys, each decoded field by
field (a garbled or hostile value is one clear RendezvousError, never a crash)."""

from __future__ import annotations

import json

import pytest

from launcher.errors import RendezvousError
from launcher.rendezvous.keys import Keys
from launcher.rendezvous.records import (
    MAX_VALUE,
    decode_descriptor,
    decode_plan,
    descriptor_id,
    encode_descriptor,
    encode_plan,
    parse_count,
    sealed_members,
    token_check,
    token_refusal,
)

# ---------------------------------------------------------------------------- the key layout


def test_the_layout_is_the_one_agents_of_every_version_share():
    k = Keys("job")
    assert [k.round, k.closed, k.restarts, k.token, k.verdict, k.acks, k.acked(2)] == [
        "job/round",
        "job/closed",
        "job/restarts",
        "job/token",
        "job/verdict",
        "job/acks",
        "job/acked2",
    ]
    assert [k.joined(3), k.node(3, 1), k.sealed(3), k.plan(3, 1), k.alive(3, 2)] == [
        "job/r3/joined",
        "job/r3/node1",
        "job/r3/sealed",
        "job/r3/plan1",
        "job/r3/alive2",
    ]
    assert [k.change(0), k.failed(0), k.cause(0), k.left(0), k.waiting(0), k.finished(0)] == [
        "job/r0/change",
        "job/r0/failed",
        "job/r0/cause",
        "job/r0/left",
        "job/r0/waiting",
        "job/r0/finished",
    ]
    assert [k.hb(1, 4), k.done(1, 4)] == ["job/r1/hb4", "job/r1/done4"]


def all_keys(k: Keys) -> list[str]:
    return [
        k.round,
        k.closed,
        k.restarts,
        k.token,
        k.verdict,
        k.acks,
        k.acked(1),
        k.joined(0),
        k.node(0, 1),
        k.sealed(0),
        k.plan(0, 1),
        k.alive(0, 1),
        k.change(0),
        k.failed(0),
        k.cause(0),
        k.left(0),
        k.waiting(0),
        k.hb(0, 0),
        k.done(0, 0),
        k.finished(0),
    ]


@pytest.mark.parametrize("other", ["jo", "job2", "j", "jobs"])
def test_every_key_of_a_job_is_under_its_prefix_and_none_under_another_runs(other):
    mine, theirs = Keys("job"), Keys(other)
    assert all(key.startswith(mine.prefix) for key in all_keys(mine))
    assert not any(key.startswith(theirs.prefix) for key in all_keys(mine))  # a run id that starts like ours
    assert len(set(all_keys(mine))) == len(all_keys(mine))


def test_a_run_id_nested_in_ours_shares_no_key_with_it():
    assert not set(all_keys(Keys("job"))) & set(all_keys(Keys("job/r0")))


# ---------------------------------------------------------------------------- descriptors and plans


def test_a_descriptor_round_trips_and_names_its_node():
    raw = encode_descriptor("host:42", "10.0.0.1", 29500, 8, -1)
    assert decode_descriptor(raw) == {"id": "host:42", "addr": "10.0.0.1", "port": 29500, "nproc": 8, "prev": -1}
    assert descriptor_id(raw) == "host:42"
    assert descriptor_id(b"{nope") is None and descriptor_id(json.dumps({"id": "a b"}).encode()) is None


@pytest.mark.parametrize(
    "change",
    [
        {"port": 0},
        {"port": 65536},
        {"port": True},  # JSON true is no port
        {"nproc": 0},
        {"addr": ""},
        {"addr": "has space"},
        {"addr": "x" * 256},
        {"prev": -2},
        {"prev": 1.0},
    ],
    ids=str,
)
def test_a_malformed_descriptor_is_a_clear_error(change):
    good = json.loads(encode_descriptor("n", "h", 1, 1, 0))
    with pytest.raises(RendezvousError, match="malformed node entry"):
        decode_descriptor(json.dumps({**good, **change}).encode())


@pytest.mark.parametrize(
    "raw, needle",
    [
        (None, "missing or oversized"),
        (b"x" * (MAX_VALUE + 1), "missing or oversized"),
        (b"{", "not JSON"),
        (b"[]", "malformed"),
    ],
)
def test_a_missing_oversized_or_garbled_value_says_which(raw, needle):
    with pytest.raises(RendezvousError, match=needle):
        decode_descriptor(raw)


PLAN = {
    "group_rank": 1,
    "group_world_size": 2,
    "rank_offset": 4,
    "world_size": 8,
    "master_addr": "h",
    "master_port": 29500,
    "restarts": 0,
}


def test_a_plan_round_trips_and_a_left_out_ticket_has_none():
    assert decode_plan(encode_plan(PLAN), nproc=4) == PLAN
    assert decode_plan(encode_plan({"left_out": "its node entry was missing or malformed"}), nproc=4) is None


@pytest.mark.parametrize(
    "change, nproc",
    [({"group_rank": 2}, 4), ({"rank_offset": 6}, 4), ({"world_size": 0}, 4), ({"master_port": "1"}, 4), ({}, 5)],
    ids=["rank-past-the-group", "offset-past-the-world", "no-world", "port-text", "more-workers-than-planned"],
)
def test_a_plan_that_does_not_fit_this_node_is_a_clear_error(change, nproc):
    with pytest.raises(RendezvousError, match="malformed plan"):
        decode_plan(encode_plan({**PLAN, **change}), nproc=nproc)


# ---------------------------------------------------------------------------- counts and the join token


def test_counts_are_small_decimals():
    assert parse_count(b"12", "round") == 12
    assert sealed_members(b"3:host:42") == 3 and sealed_members(None) is None and sealed_members(b"") is None
    for bad in (b"-1", b"1e3", b"9" * 10, b" 1", b""):
        with pytest.raises(RendezvousError, match="malformed round"):
            parse_count(bad, "round")


def test_the_join_token_check_is_keyed_by_the_run_and_never_the_token_itself():
    assert token_check(None, "job") == token_check("", "job") == b"none"
    check = token_check("s3cret", "job")
    assert b"s3cret" not in check and len(check) == 64
    assert check == token_check("s3cret", "job") != token_check("s3cret", "job2") != token_check("other", "job")


def test_a_refused_node_is_told_what_to_fix():
    assert "needs a join token: set LAUNCHER_JOIN_TOKEN" in token_refusal(token_check("t", "job"), None, "job")
    assert "started without a join token" in token_refusal(b"none", "t", "job")
    assert "LAUNCHER_JOIN_TOKEN differs" in token_refusal(token_check("t", "job"), "u", "job")
