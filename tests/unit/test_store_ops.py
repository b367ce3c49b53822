"""The store's ops without sockets (issue 32 item 7): ADD's number, APPEND in place, a wait registered
on one key at a time, a large answer built in chunks that keep what the request saw."""

from __future__ import annotations

import pytest

from launcher.tcpstore.ops import Conn, StoreOps, _stoll
from launcher.tcpstore.wire import STOP_WAITING, U8, U64, Malformed, str_frame

pytestmark = pytest.mark.timeout(30)


class Recorder(StoreOps):
    """StoreOps whose replies are kept per connection, and whose large answers are built at once."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: dict[Conn, bytearray] = {}
        self.charged = 0

    def _reply(self, c: Conn, data: bytes) -> None:
        self.replies.setdefault(c, bytearray()).extend(data)

    def _charge(self, size: int) -> None:
        self.charged += size


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (b"  12xyz", 12),
        (b"-0005", -5),
        (b"+7", 7),
        (b"0" * (8 << 20) + b"7", 7),
        (b"\t\n 9223372036854775807", (1 << 63) - 1),
        (b"-9223372036854775808", -(1 << 63)),
    ],
)
def test_add_reads_the_number_as_stoll_does(value, number):
    assert _stoll(value) == number
    assert _stoll(bytearray(value)) == number  # an appended value


@pytest.mark.parametrize("value", [b"", b"abc", b"+", b"  -", b"9223372036854775808", b"9" * (8 << 20)])
def test_add_on_what_is_no_int64_is_refused(value):
    with pytest.raises(Malformed):
        _stoll(value)


def test_append_grows_the_value_in_place_and_a_get_sees_it_whole():
    ops, c = Recorder(), Conn()
    ops._append(c, b"k", b"ab")
    first = ops.data[b"k"]
    for _ in range(1000):
        ops._append(c, b"k", b"cd")
    assert ops.data[b"k"] is first and len(first) == 2002  # one bytearray, grown: no copy per append
    ops._get(c, b"k")
    assert bytes(ops.replies[c]) == str_frame(b"ab" + b"cd" * 1000)


def test_an_append_past_what_a_get_can_answer_is_refused():
    ops, c = Recorder(), Conn()
    ops.max_reply = 64
    ops._append(c, b"k", b"x" * 50)
    with pytest.raises(Malformed, match="a GET could not answer it"):
        ops._append(c, b"k", b"x" * 10)


def test_a_wait_is_answered_once_its_keys_arrive_in_any_order_and_releases_what_it_held():
    ops, c = Recorder(), Conn()
    keys = [b"a", b"b", b"c", b"d"]
    ops._wait(c, keys)
    assert ops.charged > 0 and list(ops._waiters) == [b"a"]  # registered on one key only
    for k in (b"c", b"b", b"d"):
        ops._set(Conn(), k, b"1")
    assert c not in ops.replies and list(ops._waiters) == [b"a"]
    ops._set(Conn(), b"a", b"1")
    assert bytes(ops.replies[c]) == U8.pack(STOP_WAITING)
    assert ops.charged == 0 and not ops._waiters and not c.awaited


def test_a_multi_get_answer_keeps_the_values_the_request_saw():
    ops, c = Recorder(), Conn()
    ops._append(c, b"k", b"v" * 20000)  # a bytearray: a later APPEND grows it in place
    chunks: list = []
    ops._stream = lambda c, size, units, parts: chunks.append((size, parts))  # built later, as a server may
    ops._multi_get(c, [b"k", b"absent"])
    ops._append(c, b"k", b"w")
    size, parts = chunks[0]
    answer = b"".join(parts)
    assert answer == str_frame(b"v" * 20000) + U64.pack(0) and len(answer) == size
