"""What the job shows: events, goodput, the job board, stragglers, metrics, the failure summary.

- `events`: the JSON-lines events file; `summary`: the failure summary's lines and error files.
- `goodput`: the ledger (pure) and `accounting`: the agent's accountant, a sink of its events.
- `board`: each node's typed report (`reports`) over the rendezvous store; `stragglers`: the one
  straggler judge; `metrics`: the `--metrics_port` endpoint.

May import: `rendezvous`, `tcpstore`, `config` and the root's vocabulary; never `cli`, `agent` or
`policy` (they feed it through sinks and typed records).
"""
