"""torch's TCPStore wire format: the ops, their frames, the limits, and a parser for requests.

Framing. Every integer is little-endian (torch writes its native byte order; x86 and ARM alike):
    request = op:u8 then the op's fields, back to back, no length prefix for the whole frame
    str     = len:u64 then len bytes              (keys and values alike)
    strs    = count:u64 then count x str
A connection begins with VALIDATE; torch's client then sends PING and checks the nonce comes back.
Its client puts "/" before every key (KEY_PREFIX), and so does ours: both see the same keys.

Ops (request fields -> reply; "-" is no reply):
    0  VALIDATE     magic:u32                -> -      the first frame; anything else closes the connection
    1  SET          key value                -> -
    2  COMPARE_SET  key expected desired     -> str    the value now (see StoreServer._compare_set)
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

Limits are torch's libuv server's (a key <= 8 KiB, a value <= 8 MiB, <= 128 Ki keys a frame) plus
one of ours: no request or reply frame over 64 MiB. A frame past them closes that connection only.
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
SESSION, HOLD, WAIT_CHANGE, SESSION_INFO, ADD_ONCE = 200, 201, 202, 203, 204  # our extension (see the table above)
EXT_VERSION = 2
CHANGED, GONE = 0, 2  # WAIT_CHANGE's answers (1 is WAIT_CANCELED, as for WAIT)
MAGIC = 0x3C85F7CE  # VALIDATE's number: tells a store client from a stray connection
READY, NOT_READY = 0, 1  # CHECK's answer
STOP_WAITING, WAIT_CANCELED = 0, 1  # WAIT's (and BARRIER's) answer, then CANCEL_WAIT's
KEY_PREFIX = b"/"

MAX_KEY = 8 << 10
MAX_VALUE = 8 << 20
MAX_KEYS = 128 << 10
MAX_FRAME = 64 << 20

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
}


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


class Incomplete(Exception):
    """The frame needs more bytes than have arrived: `need` bytes from its start, at least."""

    def __init__(self, need: int):
        self.need = need


class Malformed(Exception):
    """A frame outside the protocol or its limits: its connection is closed."""


def parse(buf: bytearray, pos: int) -> tuple[int, list, int]:
    """The frame at buf[pos:] -> (op, its fields, where it ends); raises Incomplete or Malformed."""
    end = len(buf)

    def take(n: int) -> int:
        nonlocal pos
        start, pos = pos, pos + n
        if pos > end:
            raise Incomplete(pos)
        return start

    def count(cap: int, what: str) -> int:
        n = U64.unpack_from(buf, take(8))[0]
        if n > cap:
            raise Malformed(f"{what} of {n} (over {cap})")
        return n

    def blob(cap: int, what: str) -> bytes:
        n = count(cap, what)
        at = take(n)
        return bytes(buf[at : at + n])

    op = buf[take(1)]
    shape = REQUEST.get(op)
    if shape is None:
        raise Malformed(f"unknown op {op}")
    fields: list = []
    for f in shape:
        if f == "k":
            fields.append(blob(MAX_KEY, "a key"))
        elif f == "v":
            fields.append(blob(MAX_VALUE, "a value"))
        elif f == "q":
            fields.append(I64.unpack_from(buf, take(8))[0])
        elif f == "I":
            fields.append(U32.unpack_from(buf, take(4))[0])
        elif f == "Q":
            fields.append(U64.unpack_from(buf, take(8))[0])
        elif f == "K":
            fields.append([blob(MAX_KEY, "a key") for _ in range(count(MAX_KEYS, "a key count"))])
        else:  # "P"
            fields.append(
                [(blob(MAX_KEY, "a key"), blob(MAX_VALUE, "a value")) for _ in range(count(MAX_KEYS, "a key count"))]
            )
    return op, fields, pos
