"""Where the protocol keeps what: every key of one job, named once.

Keys, under `<run_id>/` (a store adds its own prefix):
    round, closed, restarts, token               job-wide
    verdict  acks  acked<k>                      the job's root cause, written before `closed`; who read it
    quarantined  quarantine<i>                   hosts kept out of the job for a cooldown (`launcher.quarantine`)
    r<r>/joined  r<r>/node<k>  r<r>/sealed        forming a round (k = ticket, 1-based)
    r<r>/plan<k>                                  what the sealer decided for ticket k
    r<r>/change  r<r>/failed  r<r>/left  r<r>/waiting  r<r>/hb<g>  r<r>/done<g>  r<r>/finished
    r<r>/alive<k>                                 held by ticket k's agent (stores with LIVENESS or CRASH)
    r<r>/cause                                    the root cause of the failure that ended round r (a verdict)
Other records of a round may live under its prefix (`of_round`): the job board's (`launcher/board.py`).
"""

from __future__ import annotations


class Keys:
    """The keys of job `run_id`: job-wide ones as attributes, a round's as methods of the round."""

    __slots__ = ("run_id", "prefix", "round", "closed", "restarts", "token", "verdict", "acks", "quarantined")

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.prefix = p = f"{run_id}/"
        self.round = p + "round"  # the round now forming or running (a decimal that only grows)
        self.closed = p + "closed"  # why the job was closed; set once, by the first closer
        self.restarts = p + "restarts"  # the job-wide restart budget used (a counter)
        self.token = p + "token"  # the join token's check (`records.token_check`)
        self.verdict = p + "verdict"  # the job's root cause (`records.encode_verdict`)
        self.acks = p + "acks"  # how many nodes read the verdict (a counter)
        self.quarantined = p + "quarantined"  # how many quarantine records there are (a counter)

    def acked(self, k: int) -> str:
        """Set by the k-th node that read the closed job's verdict (the store host waits for them)."""
        return f"{self.prefix}acked{k}"

    def quarantine(self, i: int) -> str:
        """The i-th quarantine record (1-based; `quarantine.encode`): a host kept out, why, until when."""
        return f"{self.prefix}quarantine{i}"

    def of_round(self, r: int) -> str:
        """The prefix of round r's keys."""
        return f"{self.prefix}r{r}/"

    # ---------------------------------------------------------------- forming round r

    def joined(self, r: int) -> str:
        """The ticket counter."""
        return f"{self.prefix}r{r}/joined"

    def node(self, r: int, k: int) -> str:
        """Ticket k's descriptor (`records.encode_descriptor`)."""
        return f"{self.prefix}r{r}/node{k}"

    def sealed(self, r: int) -> str:
        """`<members>:<sealer>` once the membership is frozen (`records.sealed_members`)."""
        return f"{self.prefix}r{r}/sealed"

    def plan(self, r: int, k: int) -> str:
        """Ticket k's plan, written by the sealer."""
        return f"{self.prefix}r{r}/plan{k}"

    def alive(self, r: int, k: int) -> str:
        """Held by ticket k's agent for its life (stores with LIVENESS or CRASH)."""
        return f"{self.prefix}r{r}/alive{k}"

    # ---------------------------------------------------------------- running and ending round r

    def change(self, r: int) -> str:
        """Why round r ended; every node blocks on it."""
        return f"{self.prefix}r{r}/change"

    def failed(self, r: int) -> str:
        """How many nodes reported a failure in round r (the first charges the budget)."""
        return f"{self.prefix}r{r}/failed"

    def cause(self, r: int) -> str:
        """The verdict of the failure that ended round r."""
        return f"{self.prefix}r{r}/cause"

    def left(self, r: int) -> str:
        """How many members left round r (or died)."""
        return f"{self.prefix}r{r}/left"

    def waiting(self, r: int) -> str:
        """How many nodes came too late for round r and want the next one."""
        return f"{self.prefix}r{r}/waiting"

    def hb(self, r: int, g: int) -> str:
        """Group rank g's heartbeat counter (stores without LIVENESS)."""
        return f"{self.prefix}r{r}/hb{g}"

    def done(self, r: int, g: int) -> str:
        """Set once group rank g finished round r."""
        return f"{self.prefix}r{r}/done{g}"

    def finished(self, r: int) -> str:
        """How many members finished round r."""
        return f"{self.prefix}r{r}/finished"
