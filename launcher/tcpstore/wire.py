"""torch's TCPStore wire format: the ops, their frames, the limits, and a parser for requests.

Framing. Every integer is little-endian (torch writes its native byte order; x86 and ARM alike):
    request = op:u8 then the op's fields, back to back, no length prefix for the whole frame
    str     = len:u64 then len bytes              (keys and values alike)
    strs    = count:u64 then count x str
A connection begins with VALIDATE; torch's client then sends PING and checks the nonce comes back
(torch 2.4's server has no PING: our client then sends a CHECK of no keys instead). Our server at
its cap of connections answers REFUSED in place of the nonce, and closes. Its client puts "/"
before every key (KEY_PREFIX), and so does ours: both see the same keys.

Ops (request fields -> reply; "-" is no reply):
    0  VALIDATE     magic:u32                -> -      the first frame; anything else closes the connection
    1  SET          key value                -> -
    2  COMPARE_SET  key expected desired     -> str    the value now (see StoreOps._compare_set)
    3  GET          key                      -> str    empty when absent (torch's client waits first)
    4  ADD          key delta:i64            -> i64    the sum, stored as decimal text
    5  CHECK        strs                     -> u8     0 every key exists, 1 not
    6  WAIT         strs                     -> u8     0 once every key exists, however much later
    7  GETNUMKEYS   -                        -> i64
    8  DELETE_KEY   key                      -> i64    keys deleted, 0 or 1
    9  APPEND       key value                -> -
    10 MULTI_GET    strs                     -> str per key
    11 MULTI_SET    count:u64 (key value)*   -> -
    12 CANCEL_WAIT  -                        -> u8     1; a WAIT's 0 may come just before it
    13 PING         nonce:u32                -> u32    the same nonce
    14 QUEUE_PUSH   key value                -> -
    15 QUEUE_POP    key                      -> i64 length, then str when length > 0
    16 QUEUE_LEN    key                      -> i64
    17 LIST_KEYS    -                        -> i64 count, then count x str
    18 BARRIER      key world:i64            -> u8     0 once `world` clients arrived at `key`
Extension ops (ours; torch's servers drop a connection that sends them: how a client tells, after PROBES in a row):
    200 SESSION      session:u64             -> u32    EXT_VERSION (2); this connection belongs to `session`
    201 HOLD         key value               -> u8     0: SET, and the key is held by the connection's session
    202 WAIT_CHANGE  change alive            -> u8     0 once `change` exists, 2 once `alive` is absent
                                                       (alive empty: never); CANCEL_WAIT ends it as a WAIT
    203 SESSION_INFO -                       -> u64 boot, u8 resumed   (version 2) boot: this server process's
                                                       random id; resumed: 1 when SESSION found the session live
    204 ADD_ONCE     key delta:i64 id:u64    -> i64    (version 2) ADD, counted once per `id` in the session:
                                                       sent again, it answers the first sum and adds nothing
    205 END_SESSION  -                       -> u8     0 (version 3): the session's process is gone (its guard
                                                       says so, or it leaves): its held keys go now, no lease

Limits are torch's libuv server's (a key <= 8 KiB, a value <= 8 MiB, <= 128 Ki keys a frame) plus
two of ours: no request frame over 64 MiB, no reply over 256 MiB (APPEND grows a value past 8 MiB,
as on torch's server, up to what a GET of it can answer). A frame past them closes that connection only.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

(
    VALIDATE,
    SET,
    COMPARE_SET,
    GET,
    ADD,
    CHECK,
    WAIT,
    GETNUMKEYS,
    DELETE_KEY,
    APPEND,
    MULTI_GET,
    MULTI_SET,
    CANCEL_WAIT,
    PING,
    QUEUE_PUSH,
    QUEUE_POP,
    QUEUE_LEN,
    LIST_KEYS,
    BARRIER,
) = range(19)
SESSION, HOLD, WAIT_CHANGE, SESSION_INFO, ADD_ONCE, END_SESSION = 200, 201, 202, 203, 204, 205  # our extension
EXT_VERSION = 3
CHANGED, GONE = 0, 2  # WAIT_CHANGE's answers (1 is WAIT_CANCELED, as for WAIT)
MAGIC = 0x3C85F7CE  # VALIDATE's number: tells a store client from a stray connection
READY, NOT_READY = 0, 1  # CHECK's answer
STOP_WAITING, WAIT_CANCELED = 0, 1  # WAIT's (and BARRIER's) answer, then CANCEL_WAIT's
KEY_PREFIX = b"/"
REFUSED = 0xFFFFFFFF  # our server's answer to the handshake at its cap of connections (then it closes)

MAX_KEY = 8 << 10
MAX_VALUE = 8 << 20
MAX_KEYS = 128 << 10
MAX_FRAME = 64 << 20  # a request frame
MAX_REPLY = 256 << 20  # a reply frame, so a value APPEND grew (the server's budget caps it lower if smaller)
# What a parsed item costs in memory beyond its bytes on the wire (CPython objects: a bytes object's
# header, a list slot, a pair's tuple), measured with tracemalloc: the budget counts objects, not wire.
ITEM_EXTRA, PAIR_EXTRA = 48, 112

U8, U32, I64, U64 = (struct.Struct(f) for f in ("<B", "<I", "<q", "<Q"))

# Each op's request fields: k key, v value, q i64, Q u64, I u32, K strs of keys, P count and key/value pairs.
REQUEST = {
    VALIDATE: "I",
    SET: "kv",
    COMPARE_SET: "kvv",
    GET: "k",
    ADD: "kq",
    CHECK: "K",
    WAIT: "K",
    GETNUMKEYS: "",
    DELETE_KEY: "k",
    APPEND: "kv",
    MULTI_GET: "K",
    MULTI_SET: "P",
    CANCEL_WAIT: "",
    PING: "I",
    QUEUE_PUSH: "kv",
    QUEUE_POP: "k",
    QUEUE_LEN: "k",
    LIST_KEYS: "",
    BARRIER: "kq",
    SESSION: "Q",
    HOLD: "kv",
    WAIT_CHANGE: "kk",
    SESSION_INFO: "",
    ADD_ONCE: "kqQ",
    END_SESSION: "",
}


def fields_cost(fields: list) -> int:
    """What a parsed request's fields hold in memory, counted as RequestParser.holding counts them."""
    cost = 0
    for f in fields:
        if not isinstance(f, list):
            cost += 8 + (len(f) if isinstance(f, bytes) else 0)
        elif f and isinstance(f[0], tuple):
            cost += 8 + len(f) * (16 + PAIR_EXTRA) + sum(len(k) + len(v) for k, v in f)
        else:
            cost += 8 + len(f) * (8 + ITEM_EXTRA) + sum(map(len, f))
    return cost


def death_certificate(session: int) -> bytes:
    """What an agent's guard sends to the store the moment the agent died (a connection of its own, that
    it half-closes and reads to the end): its session ends at once, its held keys with it (version 3)."""
    return U8.pack(VALIDATE) + U32.pack(MAGIC) + U8.pack(SESSION) + U64.pack(session) + U8.pack(END_SESSION)


def str_frame(data: bytes) -> bytes:
    return U64.pack(len(data)) + data


def strs_frame(items: Sequence[bytes]) -> bytes:
    return U64.pack(len(items)) + b"".join(U64.pack(len(b)) + b for b in items)


def key_frame(key: str) -> bytes:
    return str_frame(KEY_PREFIX + key.encode())


def keys_frame(keys: Sequence[str]) -> bytes:
    return strs_frame([KEY_PREFIX + k.encode() for k in keys])


def close_socket(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


class Malformed(Exception):
    """A frame outside the protocol or its limits: its connection is closed."""


_FIXED = {"q": (8, I64), "I": (4, U32), "Q": (8, U64)}


class RequestParser:
    """One connection's requests, parsed as their bytes arrive: each byte is looked at once.

    A frame that arrives in pieces is resumed where the last piece ended (the fields and list items
    read so far are kept), never parsed again from its start, so the cost is linear in the bytes
    received however slowly they trickle in. Only the field being read stays in the buffer.
    """

    __slots__ = ("buf", "pos", "size", "op", "shape", "fields", "field", "items", "count", "extra")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0  # where the next field starts in buf
        self.size = 0  # bytes of the current frame consumed before buf[0] (the frame's length so far)
        self.op = -1  # the current frame's op; -1: between frames
        self.shape, self.fields, self.field = "", [], 0
        self.items: list | None = None  # a K or P field's items so far
        self.count = 0  # how many items that field has
        self.extra = 0  # what the current frame's parsed items cost beyond their wire bytes

    def feed(self, data) -> None:
        self.buf += data

    @property
    def held(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self.buf) - self.pos

    @property
    def holding(self) -> int:
        """Memory this parser holds: the current frame's so far (its parsed items as the objects they
        are) and the bytes not yet parsed."""
        return (self.size + self.pos + self.extra if self.op >= 0 else 0) + len(self.buf) - self.pos

    @property
    def idle(self) -> bool:
        """Between frames, nothing unparsed."""
        return self.op < 0 and self.pos == len(self.buf)

    def next(self) -> tuple[int, list] | None:
        """The next whole request as (op, fields), or None until more bytes arrive; Malformed."""
        buf, end, pos = self.buf, len(self.buf), self.pos
        if self.op < 0:
            if pos >= end:
                return self._rest(pos)
            self.op = buf[pos]
            shape = REQUEST.get(self.op)
            if shape is None:
                raise Malformed(f"unknown op {self.op}")
            self.shape, self.fields, self.field, self.size, self.extra = shape, [], 0, -pos, 0
            pos += 1
        shape, fields = self.shape, self.fields
        while self.field < len(shape):
            f = shape[self.field]
            if f == "k" or f == "v":
                got = self._blob(buf, pos, end, MAX_KEY if f == "k" else MAX_VALUE)
                if got is None:
                    return self._rest(pos)
                value, pos = got
                fields.append(value)
            elif f == "K" or f == "P":
                if self.items is None:
                    if end - pos < 8:
                        return self._rest(pos)
                    self.count = U64.unpack_from(buf, pos)[0]
                    if self.count > MAX_KEYS:
                        raise Malformed(f"a key count of {self.count} (over {MAX_KEYS})")
                    pos += 8
                    self.items = []
                items, count = self.items, self.count
                while len(items) < count:
                    got = self._blob(buf, pos, end, MAX_KEY)
                    if got is None:
                        return self._rest(pos)
                    if f == "P":  # a pair is taken whole: a key read again costs at most 8 KiB
                        pair = self._blob(buf, got[1], end, MAX_VALUE)
                        if pair is None:
                            return self._rest(pos)
                        items.append((got[0], pair[0]))
                        pos = pair[1]
                        self.extra += PAIR_EXTRA
                    else:
                        items.append(got[0])
                        pos = got[1]
                        self.extra += ITEM_EXTRA
                fields.append(items)
                self.items = None
            else:
                n, unpack = _FIXED[f]
                if end - pos < n:
                    return self._rest(pos)
                fields.append(unpack.unpack_from(buf, pos)[0])
                pos += n
            self.field += 1
        op = self.op
        self.op, self.fields, self.pos = -1, [], pos
        if pos == end:
            buf.clear()
            self.pos = 0
        return op, fields

    def _blob(self, buf: bytearray, pos: int, end: int, cap: int) -> tuple[bytes, int] | None:
        if end - pos < 8:
            return None
        n = U64.unpack_from(buf, pos)[0]
        if n > cap:
            raise Malformed(f"{'a key' if cap == MAX_KEY else 'a value'} of {n} bytes (over {cap})")
        if self.size + pos + 8 + n > MAX_FRAME:
            raise Malformed(f"a frame of {self.size + pos + 8 + n} bytes or more (over {MAX_FRAME})")
        if end - pos < 8 + n:
            return None
        return bytes(buf[pos + 8 : pos + 8 + n]), pos + 8 + n

    def _rest(self, pos: int) -> None:
        """Out of bytes: drop what was parsed (its fields are kept), keep the field in progress."""
        if pos:
            self.size += pos
            del self.buf[:pos]  # from the front: CPython moves the start, it copies nothing
        self.pos = 0
        if self.size + len(self.buf) > MAX_FRAME and self.op >= 0:
            raise Malformed(f"a frame of more than {MAX_FRAME} bytes")
        return None
