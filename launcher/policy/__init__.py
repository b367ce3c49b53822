"""Between rounds: whether, when and where the job restarts (docs/policy.md).

- `governor`: what the supervisor asks between rounds; it keeps the history and applies the rest.
- `restart`: the restart policy's bookkeeping (backoff, no progress, the same error twice) and
  `requeue_after`; the policy's settings are the root's `spec.RestartPolicy`.
- `quarantine`: quarantined hosts, as records in the job's store; `health`: the health gate run
  before a node joins a round.

May import: `telemetry`, `rendezvous`, `tcpstore`, `config` and the root's vocabulary; never `cli`
or `agent`.
"""
