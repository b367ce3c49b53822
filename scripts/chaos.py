"""A randomized fault campaign: seeded, bounded, replayable.

Run:  .venv/bin/python scripts/chaos.py [--backend c10d,etcd] [--shape elastic,spares,in-place] [--episodes 20]
      [--seed N] [--bound 60] [--in-place-faults worker-kill,after-commit,...] [--dir D] [--train-seed N]

Each episode runs a real elastic job: 3 launcher agents (`--nnodes 2:3 --nproc_per_node 2 --max_restarts 3`,
a 2 s liveness timeout (the default before issue 32: the faults are sized around it), a 1 s last call,
a 3 s read timeout, a 20 s join timeout) running
tests/workers/steps.py, which checkpoints every step (4 s of training; 12 s with a link cut, 20 s with a
link down for good), on a rendezvous store: c10d, `python -m launcher store`; etcd, a 3-member etcd
cluster (static bootstrap, throwaway data dirs, elections within about a second) whose three endpoints
every agent is given. As root with iproute2, every episode runs on hosts of its own: a hub network
namespace (a bridge at 10.117.0.1, where the store or etcd runs) and one namespace per node
(10.117.0.11-13) on a veth into the bridge, all deleted when the episode ends, however it ends (those of
a campaign killed outright are deleted by the next one). Without root the episode runs on loopback.

Once every worker runs, 1 or 2 faults strike at random times (at most one per episode hits
the store):
- worker-kill: a worker SIGKILLed; agent-kill: an agent SIGKILLed (its guard stops its workers);
- node-freeze: SIGSTOP on an agent and its workers, SIGCONT after 2.5-4 s;
- store-kill: c10d, the store killed (the job must end with a reason naming it); etcd, every member
  killed and restarted on its data (the job must ride it out or end with a reason);
- disk-full (root): the --log_dir disk filled (a 2 MiB tmpfs);
- link-cut (root): one node's link set down, at the node or at the hub's bridge, for 1-12 s (both
  sides of the 2 s liveness timeout and of the 3 s read timeout), then up again;
- link-down (root): the same, down until the episode ends;
- etcd-member-kill, etcd-leader-kill (etcd): a follower, or the leader (found through etcd's
  /v3/maintenance/status), SIGKILLed and restarted on its data dir 0.5-3 s later; quorum is kept.

After the episode the invariants are checked (scripts/chaos/invariants.py): no orphan process; every live node agrees
on the round, world and restarts; no more restarts charged than workers killed; the true cause named;
the checkpoint whole; no worker line lost on a node that finished; every node finishes or ends with a
clear reason within --bound s. Beside those, per fault:
- a link cut or down: the cut node finishes, or ends with a reason naming the rendezvous store (or,
  back in time, the job's close), no traceback, nothing of it left; a link down for good: that reason
  names the store, and its workers stop within read_timeout + 9 s of the cut (none runs on, cut off);
  a cut past the liveness timeout, the episode's only fault that stops a node: every other node runs
  a round without it, or has finished, within the liveness timeout + 10 s;
- an etcd member or the leader lost (quorum kept), or the disk full, alone: ridden out, every node
  finishes in the first round with no restart and no membership change.

Shape `spares` (issue 22): a fixed-size job, `--nnodes 2` with the same three agents; the third starts once
both members' workers run and waits as a spare. Its invariants, beside the ones above: the world size never
changes (every worker of every round sees 4); a member lost (killed, frozen, or cut past the liveness
timeout) while the spare is untouched is replaced by the spare, which runs workers in a later round; every
node that was neither killed, frozen nor cut ends with the same exit code, the spare included (the job's
verdict); a lost member is charged to the budget: no more restarts than workers killed plus nodes lost.
The spares shape also runs `--quarantine after=1,window=2`, each agent named by SLURMD_NODENAME (the three
share a host name): a node whose worker was killed is quarantined at once, exits 69 and never runs a worker
again (no quarantined node is admitted), and the spare takes its place like a lost member's; so there a
worker kill is also a fault that stops a node.

Shape `in-place` (issue 33): one agent (`--nnodes 1 --nproc_per_node 3 --recovery in-place --preload
--max_restarts 3 --hang_timeout 5 --in_place_timeout 60`) on the episode's store, running
tests/workers/in_place_steps.py (a DDP model with BatchNorm and Dropout, Adam, on gloo under
`launcher.worker.inplace.Job`, 100 steps of 0.05 s, exactly reproducible: its data a function of the step and
rank, each rank's dropout its own stream; a loss all-reduce after optimizer.step(); each process logs its
pid, rank, world size, round and steps done, each optimizer step it applied, and at the end its weights'
sha256 and the optimizer steps its state applied along its lineage), with 1 or 2 faults of its
`--in-place-faults` (all by default), at 0-2.5 s: worker-kill (a stepping worker SIGKILLed), worker-freeze (one
SIGSTOPped for 0.2-1.5 s, under --hang_timeout: nothing may happen), worker-hang (SIGSTOPped for --hang_timeout
+ 2 s), agent-kill (the job runs as `--nnodes 2 --nproc_per_node 2` with a third agent as the spare; a member's
agent SIGKILLed: the spare's workers take its ranks, in place), two-ranks (two workers SIGKILLed 40-70 ms
apart), recovery-fault (a worker SIGKILLed, then another, a survivor or the replacement, 0-0.3 s after the
replacement's spawn and before `recovered`; replacements wait 0.6 s before they join); and, inflicted by a
drawn rank on itself (the worker's DIE_AT, first round only): after-commit (after optimizer.step() of a drawn
step, before the loss all-reduce), startup (before Job()), teardown (after the last step, before job.close()).
Invariants (scripts/chaos/inplace.py), on each agent's events file and the step logs, beside the ones above
that apply (no orphan, ended clearly, the cause named): a rank's pid changes only where a fault ended its
process (the survivors keep theirs), no group stopped unless the launcher declined in place because a worker
failed while a recovery was under way, the world size never changes, a rank's step never goes back more than
one and no process does a step twice, a job that succeeded did every step, one verdict per agent and the same
for all, and the restarts charged match the events (one per round a failure opened, within the budget, no more
than the workers failed and killed; `recovered` names the failed ranks). Exactness (scripts/chaos/exact.py):
the job succeeded and every rank's final weights are the undisturbed run's (the same job, world size, steps
and --train-seed run once without faults and cached in --dir, /tmp/chaos-campaign by default; the output
says which), its state applied each step's optimizer step once along its lineage, no process applied a step
twice, the restarts charged are within each kind's cost (teardown 0, two-ranks 1, recovery-fault 2, the
others 1, a freeze 0), a startup death has the job stepping within 20 s (it never waits out
--in_place_timeout), and a teardown death runs no step again.

A violation prints the episode's seed: `--seed S --episodes 1` replays it (the times and the victims
are the seed's; what the processes do with them is up to the kernel); `--keep` keeps its folder with
the agents' output. The last lines count the faults that landed, per kind, and the seconds an episode
took. Exit status 0 when no invariant was violated, 1 otherwise.

The parts live in scripts/chaos/: records.py (the fault kinds, shapes, timings and an episode's typed
records), proc.py, net.py and stores.py (the processes, hosts and store), faults.py (the seed's schedule
and what each kind does), invariants.py, inplace.py and exact.py (the checks, pure functions of an episode's
record), reference.py (the in-place job's undisturbed weights), episode.py
(one episode run and checked) and campaign.py (this command line).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The package scripts/chaos/ (a package wins over this module of the same name), and the tests' helpers
# (tests/support/, importable as `support`), which its processes are found by.
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from chaos.campaign import main  # noqa: E402

if __name__ == "__main__":
    try:
        sys.exit(main(__doc__.splitlines()[0]))
    except KeyboardInterrupt:  # the episode under way cleaned up on the way out
        print("chaos: interrupted", flush=True)
        sys.exit(130)
