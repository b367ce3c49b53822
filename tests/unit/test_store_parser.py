"""The store's request parser (launcher/tcpstore/wire.py), in-process: frames in pieces, limits, and a
cost linear in the bytes received (issue 23 item 2: a frame re-parsed from its first byte on every
arrival let 24 trickling clients hold the store at 100 % CPU)."""

from __future__ import annotations

import struct

import pytest
from support.frames import HELLO, keys, s, u64

from launcher.tcpstore import wire
from launcher.tcpstore.wire import MAX_FRAME, MAX_KEY, MAX_KEYS, MAX_VALUE, Malformed, RequestParser

SET = bytes([wire.SET]) + s(b"/k") + s(b"value")
ADD = bytes([wire.ADD]) + s(b"/n") + struct.pack("<q", -3)
MULTI_GET = bytes([wire.MULTI_GET]) + keys(b"/a", b"/bb", b"")
MULTI_SET = bytes([wire.MULTI_SET]) + u64(2) + s(b"/a") + s(b"1") + s(b"/b") + s(b"22")
GETNUMKEYS = bytes([wire.GETNUMKEYS])
WANT = [
    (wire.VALIDATE, [wire.MAGIC]),
    (wire.SET, [b"/k", b"value"]),
    (wire.ADD, [b"/n", -3]),
    (wire.MULTI_GET, [[b"/a", b"/bb", b""]]),
    (wire.MULTI_SET, [[(b"/a", b"1"), (b"/b", b"22")]]),
    (wire.GETNUMKEYS, []),
]
STREAM = HELLO + SET + ADD + MULTI_GET + MULTI_SET + GETNUMKEYS


def drain(p: RequestParser) -> list:
    out = []
    while (got := p.next()) is not None:
        out.append(got)
    return out


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64, len(STREAM)])
def test_frames_in_any_pieces_parse_to_the_same_requests(piece):
    p, got = RequestParser(), []
    for i in range(0, len(STREAM), piece):
        p.feed(STREAM[i : i + piece])
        got += drain(p)
    assert got == WANT
    assert p.idle and p.holding == 0


def test_the_parser_keeps_only_the_field_in_progress():
    p = RequestParser()
    big = bytes([wire.MULTI_GET]) + keys(*[b"/key%05d" % i for i in range(1000)])
    p.feed(big[: len(big) // 2])
    assert p.next() is None
    assert len(p.buf) < 32  # the keys read so far moved out of the buffer; only a partial key stays
    assert p.holding >= len(big) // 2 - 32  # and they still count against the memory budget
    p.feed(big[len(big) // 2 :])
    (op, [got]) = p.next()
    assert op == wire.MULTI_GET and len(got) == 1000 and got[-1] == b"/key00999"


def test_a_trickled_frame_costs_linear_in_its_bytes(monkeypatch):
    """131,072 keys arriving 1 KiB at a time: each key is read once, each arrival adds one look at
    the key in progress (re-parsing from the frame's start would cost keys x arrivals ~ 10^9)."""
    n = MAX_KEYS
    frame = bytes([wire.MULTI_GET]) + keys(*[b"/k%06d" % i for i in range(n)])
    looks = [0]
    real = RequestParser._blob

    def counted(self, *a):
        looks[0] += self is p  # this parser's alone: a store server an earlier test left in this process parses too
        return real(self, *a)

    p, arrivals, done = RequestParser(), 0, None
    monkeypatch.setattr(RequestParser, "_blob", counted)
    for i in range(0, len(frame), 1024):
        p.feed(frame[i : i + 1024])
        arrivals += 1
        done = p.next() or done
    assert done is not None and len(done[1][0]) == n
    assert looks[0] <= n + arrivals


@pytest.mark.parametrize(
    "frame, why",
    [
        (b"\x63", "unknown op 99"),
        (bytes([wire.SET]) + u64(MAX_KEY + 1), "a key of"),
        (bytes([wire.SET]) + s(b"/k") + u64(MAX_VALUE + 1), "a value of"),
        (bytes([wire.MULTI_GET]) + u64(MAX_KEYS + 1), "a key count of"),
        (bytes([wire.MULTI_SET]) + u64(8) + (s(b"/k") + u64(MAX_VALUE)) * 1, None),  # fine so far: incomplete
    ],
)
def test_limits_are_checked_as_soon_as_the_length_arrives(frame, why):
    p = RequestParser()
    p.feed(frame)
    if why is None:
        assert p.next() is None
        return
    with pytest.raises(Malformed, match=why):
        p.next()


def test_a_frame_over_max_frame_is_refused_before_it_arrives():
    """Eight values of 8 MiB announced one after the other: the ninth length crosses MAX_FRAME."""
    p = RequestParser()
    value = b"x" * MAX_VALUE
    p.feed(bytes([wire.MULTI_SET]) + u64(100))
    with pytest.raises(Malformed, match="a frame of"):
        for i in range(100):
            p.feed(s(b"/k%d" % i) + s(value))
            assert p.next() is None
    assert i * MAX_VALUE <= MAX_FRAME
