"""Where the protocol keeps what: every key of one job, named once.

Keys, under `<run_id>/` in the job's first epoch and `<run_id>/e<epoch>/` in a later one (a store adds its
own prefix; `rerun` starts a new epoch when a job id is run again on a store that kept a dead run's keys):
    epoch, token                                 under `<run_id>/` always: the job's epoch, its join token check
    quarantined  quarantine<i>                   under `<run_id>/` always: hosts kept out for a cooldown
    round, closed, restarts                      job-wide
    verdict  acks  acked<k>                      the job's root cause, written before `closed`; who read it
    r<r>/joined  r<r>/node<k>  r<r>/sealed        forming a round (k = ticket, 1-based)
    r<r>/plan<k>                                  what the sealer decided for ticket k
    r<r>/change  r<r>/failed  r<r>/left  r<r>/waiting  r<r>/hb<g>  r<r>/done<g>  r<r>/finished
    r<r>/alive<k>                                 held by ticket k's agent (stores with LIVENESS or CRASH)
    r<r>/cause                                    the root cause of the failure that ended round r (a verdict)
    r<r>/lost<g>  r<r>/told<g>  r<r>/dead         why group rank g was lost, its tellers; tickets and spares found dead
    spares  spare<j>  sparealive<j>               spare j's number, entry, and alive key (held by its agent)
Other records of a round may live under its prefix (`of_round`): the job board's (`launcher/telemetry/board.py`).
"""

from __future__ import annotations


class Keys:
    """The keys of job `run_id`: job-wide ones as attributes, a round's as methods of the round."""

    __slots__ = (
        *("run_id", "epoch", "epoch_key", "prefix", "round", "closed", "restarts", "token"),
        *("verdict", "acks", "quarantined", "spares"),
    )

    def __init__(self, run_id: str, epoch: int = 0):
        self.run_id = run_id
        self.epoch = epoch
        self.epoch_key = f"{run_id}/epoch"  # the job's epoch (a decimal that only grows; absent: 0)
        self.token = f"{run_id}/token"  # the join token's check (`records.token_check`); every epoch's
        self.prefix = p = f"{run_id}/" if epoch == 0 else f"{run_id}/e{epoch}/"
        self.round = p + "round"  # the round now forming or running (a decimal that only grows)
        self.closed = p + "closed"  # why the job was closed; set once, by the first closer
        self.restarts = p + "restarts"  # the job-wide restart budget used (a counter)
        self.verdict = p + "verdict"  # the job's root cause (`records.encode_verdict`)
        self.acks = p + "acks"  # how many nodes read the verdict (a counter)
        self.spares = p + "spares"  # how many spares registered in this job (a counter: spare numbers)
        self.quarantined = f"{run_id}/quarantined"  # how many quarantine records (a counter); every epoch's

    def rebase(self, epoch: int) -> None:
        """Move these keys (shared by the protocol's parts) to the job's `epoch`."""
        self.__init__(self.run_id, epoch)  # type: ignore[misc]

    def acked(self, k: int) -> str:
        """Set by the k-th node that read the closed job's verdict (the store host waits for them)."""
        return f"{self.prefix}acked{k}"

    def spare(self, j: int) -> str:
        """Spare j's entry (`spares.encode_spare`); deleted once it joins a round or leaves."""
        return f"{self.prefix}spare{j}"

    def spare_alive(self, j: int) -> str:
        """Held by spare j's agent while it waits (stores with LIVENESS or CRASH)."""
        return f"{self.prefix}sparealive{j}"

    def quarantine(self, i: int) -> str:
        """The i-th quarantine record (1-based; `quarantine.encode`): a host kept out, why, until when."""
        return f"{self.run_id}/quarantine{i}"

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
        """How many nodes came too late for round r, or waited as its spares, and want the next one."""
        return f"{self.prefix}r{r}/waiting"

    def lost(self, r: int, g: int) -> str:
        """Why group rank g was lost in round r (it died, or left)."""
        return f"{self.prefix}r{r}/lost{g}"

    def told(self, r: int, g: int) -> str:
        """How many nodes told group rank g's loss in round r (the first one counts it)."""
        return f"{self.prefix}r{r}/told{g}"

    def dead(self, r: int) -> str:
        """How many of round r's tickets died while it formed, and of its spares were found dead."""
        return f"{self.prefix}r{r}/dead"

    def hb(self, r: int, g: int) -> str:
        """Group rank g's heartbeat counter (stores without LIVENESS)."""
        return f"{self.prefix}r{r}/hb{g}"

    def done(self, r: int, g: int) -> str:
        """Set once group rank g finished round r."""
        return f"{self.prefix}r{r}/done{g}"

    def finished(self, r: int) -> str:
        """How many members finished round r."""
        return f"{self.prefix}r{r}/finished"
