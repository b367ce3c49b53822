"""What the protocol writes to the store and reads back: the records (this node, its descriptor, the
plans, the verdict, counts, the join token's check) and their checks, in one style: a table of
field predicates per record, applied by `checked`.

The store is shared, so a value under the job's prefix may be garbled or hostile: every value read
back is bounded (MAX_VALUE) and checked field by field; a bad one is a RendezvousError that names it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import RendezvousError
from ..net import hostname, interface_of, outward_address
from ..spec import Verdict
from .api import JobParams

log = logging.getLogger(__name__)

MAX_VALUE = 1 << 16  # a descriptor or plan larger than this is hostile, not ours
MAX_VERDICT = 4096  # a verdict is a few short fields; anything larger is not ours
MAX_DEPTH = 8  # our records nest at most three deep: deeper is hostile (and json recurses per level)
MAX_TEXT = 300  # a reason or a closing text read back is cut to this many characters


def printable(raw: bytes | str, limit: int = MAX_TEXT) -> str:
    """Text read from the store, safe for a log line, the live view or `status`: cut to `limit`, and
    every control character (a newline, an escape sequence, a bidi override) shown as a space."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return "".join(c if c.isprintable() else " " for c in text[:limit])


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


def nesting(raw: bytes) -> int:
    """How deep the JSON arrays and objects in `raw` nest (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:  # ours, mostly: no need to walk it
        return MAX_DEPTH
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub(b"", raw)):
        depth += 1 if bracket in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


@dataclass(frozen=True)
class Node:
    """What this node tells the others when it joins a round."""

    node_id: str  # host:pid, unique per agent
    addr: str  # where its workers can be reached (the bootstrap store, if it gets rank 0)
    nproc: int
    min_nodes: int
    max_nodes: int
    max_restarts: int
    ifname: str | None = None  # the interface that carries `addr`
    token: str | None = field(default=None, repr=False)  # the job's join token, if it has one

    @classmethod
    def of_this_agent(cls, job: JobParams, store: tuple[str, int]) -> Node:
        """This agent as it joins: reached at --local_addr, else at its address on the route to `store`."""
        addr = job.local_addr or outward_address(*store)
        return cls(
            node_id=f"{hostname()}:{os.getpid()}",
            addr=addr,
            ifname=interface_of(addr),
            nproc=job.nproc_per_node,
            min_nodes=job.min_nodes,
            max_nodes=job.max_nodes,
            max_restarts=job.max_restarts,
            token=job.join_token,
        )


def token_check(token: str | None, run_id: str) -> bytes:
    """What the store keeps under `token`: an HMAC of the run id with the join token, or `none`."""
    if not token:
        return b"none"
    import hmac  # loads OpenSSL: only for a job with a token

    return hmac.new(token.encode(), f"launcher-join:{run_id}".encode(), "sha256").hexdigest().encode()


def token_refusal(theirs: bytes, token: str | None, run_id: str) -> str:
    """Why a node whose token check is not the job's (`theirs`) may not join, and what to fix."""
    if not token:
        return (
            f"job {run_id!r} needs a join token: set LAUNCHER_JOIN_TOKEN "
            "(or --rdzv_conf join_token_file=PATH) as on its other nodes"
        )
    if theirs == b"none":
        return (
            f"job {run_id!r} was started without a join token, but this node has one; "
            "use the same setting on every node"
        )
    return f"wrong join token for job {run_id!r}: this node's LAUNCHER_JOIN_TOKEN differs from the other nodes'"


# Every value read back is checked field by field, by these predicates (bool is not an int here:
# JSON `true` is no rank); `checked` applies a table of them.
def integer(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: type(v) is int and lo <= v < hi


def address(v: object) -> bool:
    return type(v) is str and 0 < len(v) <= 255 and v.isprintable() and " " not in v


DESC_FIELDS = {"addr": address, "port": integer(1, 65536), "nproc": integer(1, 1 << 20), "prev": integer(-1, 1 << 31)}
PLAN_FIELDS = {
    "group_rank": integer(0, 1 << 31),
    "group_world_size": integer(1, 1 << 31),
    "rank_offset": integer(0, 1 << 31),
    "world_size": integer(1, 1 << 31),
    "master_addr": address,
    "master_port": integer(1, 65536),
    "restarts": integer(0, 1 << 31),
}


def number(v: object) -> bool:
    return type(v) in (int, float) and v == v and abs(v) < 1e12  # type: ignore[operator]


def text(limit: int) -> Callable[[object], bool]:
    return lambda v: type(v) is str and len(v) <= limit and v.isprintable()


VERDICT_LIMITS = {"host": 255, "node": 255, "error": 300, "log": 1024}
VERDICT_FIELDS = {
    **{name: text(limit) for name, limit in VERDICT_LIMITS.items()},
    "rank": integer(0, 1 << 31),
    "local_rank": integer(0, 1 << 20),
    "returncode": integer(-255, 256),
    "round": integer(0, 1 << 31),
    "code": integer(0, 256),
}


def encode_descriptor(node_id: str, addr: str, port: int, nproc: int, prev: int) -> bytes:
    """What a node writes under its ticket: who it is, where its workers' store would be, its last group rank."""
    return json.dumps({"id": node_id, "addr": addr, "port": port, "nproc": nproc, "prev": prev}).encode()


def decode_descriptor(raw: bytes | None) -> dict:
    """A ticket's descriptor, checked; a missing or malformed one is a RendezvousError."""
    return checked(load(raw, "node entry"), DESC_FIELDS, "node entry")


SPARE_FIELDS = {"node": address, "host": address, "since": number}


def encode_spare(node_id: str, host: str, since: float) -> bytes:
    """A spare's entry: who it is, on which host, since when (epoch seconds)."""
    return json.dumps({"node": node_id, "host": host, "since": round(since, 3)}).encode()


def decode_spare(raw: bytes | None) -> dict:
    """A spare's entry, checked; a missing or malformed one is a RendezvousError."""
    return checked(load(raw, "spare entry"), SPARE_FIELDS, "spare entry")


def descriptor_id(raw: bytes | None) -> str | None:
    """The node id a descriptor names, if it reads well (for the line that names missing nodes)."""
    try:
        node_id = load(raw, "node entry").get("id")
    except RendezvousError:
        return None
    return node_id if address(node_id) else None


def assign(descs: list[dict], restarts: int) -> list[dict]:
    """Plans for one sealed round: nodes keep last round's group rank where they can; ranks follow."""
    n = len(descs)
    ranks: list[int | None] = [None] * n
    taken: set[int] = set()
    for i, d in enumerate(descs):
        prev = d.get("prev", -1)
        if isinstance(prev, int) and 0 <= prev < n and prev not in taken:
            ranks[i] = prev
            taken.add(prev)
    free = iter(sorted(set(range(n)) - taken))
    ranks = [r if r is not None else next(free) for r in ranks]
    by_rank = sorted(range(n), key=lambda i: ranks[i])
    offsets, total = {}, 0
    for i in by_rank:
        offsets[i] = total
        total += descs[i]["nproc"]
    master = descs[by_rank[0]]
    return [
        {
            "group_rank": ranks[i],
            "group_world_size": n,
            "rank_offset": offsets[i],
            "world_size": total,
            "master_addr": master["addr"],
            "master_port": master["port"],
            "restarts": restarts,
            "peer": by_rank[(ranks[i] + 1) % n] + 1,  # the right-hand neighbour's ticket
        }
        for i in range(n)
    ]


LEFT_OUT = {
    "left_out": "its node entry was missing or malformed, or its node died"
}  # the plan of a ticket the sealer left out


def encode_plan(plan: dict) -> bytes:
    return json.dumps(plan).encode()


def decode_plan(raw: bytes, nproc: int) -> dict | None:
    """A ticket's plan, checked (and consistent with this node's `nproc`); None when the sealer left it out."""
    plan = load(raw, "plan")
    if "left_out" in plan:
        return None
    checked(plan, PLAN_FIELDS, "plan")
    if not (plan["group_rank"] < plan["group_world_size"] and plan["rank_offset"] + nproc <= plan["world_size"]):
        raise RendezvousError("rendezvous store holds a malformed plan under this job's prefix")
    return plan


def encode_verdict(v: Verdict) -> bytes:
    """The verdict as the store keeps it: JSON, its text fields cut to their limits and made printable."""
    fields = {name: getattr(v, name) for name in VERDICT_FIELDS}
    for name, limit in VERDICT_LIMITS.items():
        fields[name] = "".join(c if c.isprintable() else " " for c in fields[name])[:limit]
    return json.dumps(fields).encode()


def decode_verdict(raw: bytes) -> Verdict:
    """A verdict read back from the store, checked field by field; anything else is a RendezvousError."""
    if len(raw) > MAX_VERDICT:
        raise RendezvousError("rendezvous store holds an oversized verdict under this job's prefix")
    value = checked(load(raw, "verdict"), VERDICT_FIELDS, "verdict")
    return Verdict(**{name: value[name] for name in VERDICT_FIELDS})


def failure_text(raw: bytes | None) -> str | None:
    """The failure a round's `cause` key reports, as the other nodes say it; None: none, or not ours."""
    if raw is None:
        return None
    try:
        cause = decode_verdict(raw)
    except RendezvousError as e:  # garbled or hostile: the round's change text names it instead
        log.debug(f"{e}; ignored")
        return None
    return cause.describe() + (f": {cause.error}" if cause.error else "") + f", node {cause.node}"


def load(raw: bytes | None, what: str) -> dict:
    """A JSON object from the store; a missing, oversized or garbled value is a clear error."""
    if raw is None or len(raw) > MAX_VALUE:
        raise RendezvousError(f"rendezvous store holds a missing or oversized {what} under this job's prefix")
    if nesting(raw) > MAX_DEPTH:
        raise RendezvousError(f"rendezvous store holds a {what} nested too deep under this job's prefix")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise RendezvousError(f"rendezvous store holds a {what} that is not JSON under this job's prefix") from None
    if not isinstance(value, dict):
        raise RendezvousError(f"rendezvous store holds a malformed {what} under this job's prefix")
    return value


def checked(value: dict, fields: dict[str, Callable[[object], bool]], what: str) -> dict:
    if not all(name in value and ok(value[name]) for name, ok in fields.items()):
        raise RendezvousError(f"rendezvous store holds a malformed {what} under this job's prefix")
    return value


def sealed_members(raw: bytes | None) -> int | None:
    """How many nodes a round's `sealed` value says it has (None: not sealed yet)."""
    return parse_count(raw.split(b":", 1)[0], "seal") if raw else None


def parse_count(raw: bytes, what: str) -> int:
    """A round number or seal count written by the protocol: a small decimal, or a clear error."""
    if not (raw.isdigit() and len(raw) <= 9):
        raise RendezvousError(f"rendezvous store holds a malformed {what} under this job's prefix")
    return int(raw)


def read_counter(raw: bytes | None) -> int | None:
    """A counter written by ADD (a decimal, maybe signed); 0 when absent; None when it is no number."""
    if raw is None:
        return 0
    text = raw.strip()
    return int(text) if text.lstrip(b"+-").isdigit() and len(text) <= 20 else None
