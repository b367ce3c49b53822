"""The randomized fault campaign that scripts/chaos.py runs, in parts: records (the vocabulary); proc, net and
stores (the cluster); faults (each kind); invariants (pure checks); episode (one run); campaign (the command)."""
