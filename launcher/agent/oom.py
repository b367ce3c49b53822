"""Was a SIGKILL the kernel's OOM killer? Only the kernel knows; the launcher asks it two ways.

- The cgroup's own count: `oom_kill` in `memory.events` (cgroup v2) or `memory.oom_control`
  (v1) of the launcher's memory cgroup, which its workers share. Read once per round at spawn and
  again when a worker dies by SIGKILL: a rise means the OOM killer acted in the meantime.
- The kernel log (`/dev/kmsg`, where readable): "Killed process PID" or "oom-kill:...pid=PID,".
A SIGKILL with neither sign came from outside (a user, a scheduler, a watchdog) and says only that.
"""

from __future__ import annotations

import os
import re

OOM_REASON = "killed by SIGKILL: out of memory (the kernel's OOM killer)"


def oom_kills(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The `oom_kill` count of this process's memory cgroup; None where it cannot be read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    files = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.strip().lstrip("/")
        if "memory" in controllers.split(","):
            files.append(os.path.join(root, "memory", rel, "memory.oom_control"))
        elif hierarchy == "0" and not controllers:
            files += [os.path.join(root, rel, "memory.events"), os.path.join(root, "unified", rel, "memory.events")]
    for name in files:
        try:
            with open(name) as f:
                found = re.search(r"^oom_kill (\d+)$", f.read(), re.M)
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return None


def kernel_log_says_oom(pid: int, since: float = 0.0, kmsg: str = "/dev/kmsg") -> bool:
    """Whether the kernel log, where this process may read it, records an OOM kill of `pid` no
    earlier than `since` (CLOCK_MONOTONIC seconds, the clock of its records; an older pid's is not)."""
    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*[,:]pid={pid},)")
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:  # the end of the log
                return False
            except OSError:  # EPIPE: a record was overwritten while reading; go on with the next
                continue
            if not record:
                return False
            head, _, text = record.decode(errors="replace").partition(";")
            fields = head.split(",")
            recent = len(fields) < 3 or not fields[2].isdigit() or int(fields[2]) >= (since - 1.0) * 1e6
            if recent and pattern.search(text):
                return True
    finally:
        os.close(fd)


def oom_reason(pid: int, before: int | None, started: float = 0.0) -> str:
    """OOM_REASON when the kernel's OOM killer ended `pid` (killed by SIGKILL, started at monotonic
    `started`; `before`: the cgroup's count then), else ""."""
    now = oom_kills()
    if (before is not None and now is not None and now > before) or kernel_log_says_oom(pid, started):
        return OOM_REASON
    return ""
