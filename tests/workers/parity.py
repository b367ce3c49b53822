"""Dump what a worker's start left it with to $DUMP_DIR/<RANK>.json: forked and spawned must agree."""

import faulthandler
import gc
import json
import os
import signal
import sys

import torch

handlers = {}
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGUSR1, signal.SIGHUP, signal.SIGCHLD):
    h = signal.getsignal(sig)
    handlers[sig.name] = getattr(h, "__name__", str(h))
with open("/proc/self/status") as f:
    masks = {k: v.strip() for k, v in (line.split(":", 1) for line in f) if k in ("SigBlk", "SigIgn")}
dump = {
    "env": dict(os.environ),
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "file": __file__,
    "threads": torch.get_num_threads(),
    "interop": torch.get_num_interop_threads(),
    "cuda_initialized": torch.cuda.is_initialized(),
    "handlers": handlers,
    "masks": masks,
    "own_group": os.getpgid(0) == os.getpid(),
    "parent_is_agent": os.getppid() == int(os.environ["LAUNCHER_AGENT_ID"].split("-")[0]),
    "cwd": os.getcwd(),
    "faulthandler": faulthandler.is_enabled(),
    "gc": [gc.isenabled(), *gc.get_threshold()],  # the zygote preloads with the collector off
    "stdout_write_through": sys.stdout.write_through,
    "forked": "launcher.agent.zygote" in open("/proc/self/cmdline").read(),
}
with open(os.path.join(os.environ["DUMP_DIR"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(dump, f)
