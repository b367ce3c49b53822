"""The agent: the process on each node that owns the workers (torchrun's elastic agent).

- `supervisor`: **the loop** (`Supervisor.step`): rounds, spawns, reaps, signals, restarts;
  `loop_events`: what reaches it from other threads; `signals`: signal capture into that queue.
- `members`: one worker of the round: its process, streams, progress, failure; `awake`: the agent's
  own stalls, left out of the hang clock; `process`: spawn, reap (pidfds), kill a whole tree, the
  guard; `zygote/`: workers forked from a preloaded interpreter; `quick_exit`: what a Python worker
  runs, spawned or forked (its script, then python's exit without finalisation; stdlib only), which
  a spawned one reaches through its few-line main file `worker_exit.py`;
  `recovery`: `--recovery in-place`'s agent side; `parts`: the supervisor's collaborators.
- `env`: **the worker environment** (torch's contract); `numa`: `--numa_binding`; `logs`,
  `logs_specs`: worker output to console and files; `bootstrap`: the workers' store (MASTER_ADDR);
  `filetimer`: torch's file-timer watchdog; `notify`: sd_notify; `oom`: was it the OOM killer?

May import: `policy`, `telemetry`, `rendezvous`, `tcpstore`, `config` and the root's vocabulary;
never `cli`.
"""
