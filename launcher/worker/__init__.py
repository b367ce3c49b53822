"""Code that runs inside a worker, in the user's training process.

- `progress`: `launcher.progress(step=)`, the heartbeat for `--hang_timeout` and the step rate.
- `errorfile`: `launcher.record`, torch's `@record` error file without importing torch.
- `allreduce`: `launcher bench allreduce`; `preflight`: `launcher check`.
- `inplace/`: `Job`, what a training script adopts for `--recovery in-place` (docs/in-place.md).

May import only the store's client (`tcpstore`) and the root's vocabulary (and torch): a worker
never loads the agent. This package file imports nothing, so that `launcher.progress` stays cheap.
"""
