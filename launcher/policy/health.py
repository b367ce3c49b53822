"""The health gate: may this node join the next round? Run before each round it joins.

Two parts, either optional: `--health_check CMD` (a shell command, bounded in time; non-zero
keeps the node out), and built-in GPU checks when NVML is importable (the `gpu` extra:
`pip install -e '.[gpu]'` from a checkout, module `pynvml`): the GPUs this node should have are visible, none has
uncorrected ECC errors or retired pages / remapped rows pending, and the last round's workers no
longer hold GPU memory (waited for up to `memory_wait` s). NVML is reached through a seam (`nvml=`)
so that tests fake it; the real one cannot run on a machine without an NVIDIA driver.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger(__name__)
HEALTH_TIMEOUT = 60.0  # seconds --health_check CMD may take before it counts as failed
MEMORY_WAIT = 30.0  # seconds the last workers' GPU memory may take to be freed
POLL = 0.5  # seconds between looks at the GPUs' processes
OUTPUT_LIMIT = 200  # characters of the command's last line quoted in the reason


def load_nvml() -> Any | None:
    """pynvml, initialised; None when it is not installed or there is no NVIDIA driver."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded: no GPU here
        log.debug("NVML is installed but does not start (%s); no built-in GPU checks", e)
        return None
    return pynvml


class HealthGate:
    """One call per round: `check(previous_pids)` returns "" when healthy, else one line saying why not."""

    def __init__(
        self,
        command: str | None,
        *,
        timeout: float = HEALTH_TIMEOUT,
        gpus: Sequence[str] = (),
        nvml: Callable[[], Any | None] = load_nvml,
        memory_wait: float = MEMORY_WAIT,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        env: Mapping[str, str] | None = None,
    ):
        self.command = command
        self.env = env  # the command's environment (with the agent's marker: its guard kills it if the agent dies)
        self._running: subprocess.Popen | None = None
        self._lock = threading.Lock()  # a check starts, or `cancel()` acts, not both at once
        self._cancelled = False
        self.cut_short = False  # `cancel()` killed a check or kept one from starting: its answer says nothing
        self.timeout = timeout
        self.gpus = tuple(gpus)  # the ids or UUIDs this node's workers use; () = every GPU NVML lists
        self._load_nvml = nvml
        self._nvml: Any | None = None
        self._loaded = False
        self.memory_wait = memory_wait
        self.clock = clock
        self.sleep = sleep

    def check(self, previous_pids: Collection[int] = ()) -> str:
        """Run the GPU checks, then the command; the first problem found, or ""."""
        nvml = self.nvml()
        if nvml is not None:
            problem = gpu_problem(nvml, self.gpus, previous_pids, self.memory_wait, self.clock, self.sleep)
            if problem:
                return problem
        return run_command(self.command, self.timeout, self.env, self._start) if self.command else ""

    def cancel(self) -> None:
        """Kill a check still running and let none start after (the agent is leaving): no health check
        outlives its agent."""
        with self._lock:
            self._cancelled = True
            proc = self._running
        if proc is not None and proc.poll() is None:
            self.cut_short = True
            _kill_session(proc)

    def _start(self, spawn: Callable[[], subprocess.Popen]) -> subprocess.Popen | None:
        """`spawn()` unless cancelled (None). Under the lock: a `cancel()` on another thread (the agent's
        main one; the check runs on the rendezvous thread) comes either first, and nothing starts, or after
        the check's process exists and is known, and kills it. (Known only once `Popen` returned, a check
        started in between outlived an agent stopped at once, ~1 suite run in 70.)"""
        with self._lock:
            if self._cancelled:
                self.cut_short = True
                return None
            self._running = spawn()
            return self._running

    def nvml(self) -> Any | None:
        if not self._loaded:
            self._nvml, self._loaded = self._load_nvml(), True
        return self._nvml


def run_command(
    command: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    start: Callable[[Callable[[], subprocess.Popen]], subprocess.Popen | None] = lambda spawn: spawn(),
) -> str:
    """Run `command` with /bin/sh in its own session; "" on exit 0, else why (its last output line).
    `start` makes the process with the function it is given, or returns None where it must not run
    (a `HealthGate` cancelled: the agent is leaving)."""

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    try:
        proc = start(spawn)
    except OSError as e:
        return f"--health_check {command!r} cannot start: {e.strerror or e}"
    if proc is None:
        return f"--health_check {command!r} was not run: the agent is leaving"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        proc.communicate()
        return f"--health_check {command!r} did not finish within {timeout:g} s"
    if proc.returncode == 0:
        return ""
    lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
    said = f": {lines[-1][:OUTPUT_LIMIT]}" if lines else ""
    how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
    return f"--health_check {command!r} {how}{said}"


def _kill_session(proc: subprocess.Popen) -> None:
    # Its own session: the whole tree goes, not just the shell.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def gpu_problem(
    nvml: Any,
    gpus: Sequence[str],
    previous_pids: Collection[int],
    memory_wait: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> str:
    """The first GPU problem NVML shows on this node's GPUs, or ""."""
    try:
        count = nvml.nvmlDeviceGetCount()
        if gpus:
            handles = {}
            for gpu in gpus:
                try:
                    handles[gpu] = (
                        nvml.nvmlDeviceGetHandleByUUID(gpu)
                        if not gpu.isdigit()
                        else nvml.nvmlDeviceGetHandleByIndex(int(gpu))
                    )
                except nvml.NVMLError:
                    return f"GPU {gpu} is not visible (NVML lists {count} GPU(s))"
        else:
            handles = {str(i): nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)}
        for gpu, h in handles.items():
            problem = _errors(nvml, gpu, h)
            if problem:
                return problem
        return _wait_memory_freed(nvml, handles, set(previous_pids), memory_wait, clock, sleep)
    except nvml.NVMLError as e:
        return f"NVML cannot read this node's GPUs: {e}"


def _errors(nvml: Any, gpu: str, h: Any) -> str:
    """Uncorrected ECC errors since boot, retired pages pending, rows remapping pending or failed."""
    ecc = _supported(
        nvml,
        lambda: nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
    )
    if ecc:
        return f"GPU {gpu} has {ecc} uncorrected ECC error(s) since the driver loaded"
    if _supported(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h)) == nvml.NVML_FEATURE_ENABLED:
        return f"GPU {gpu} has retired pages pending: it needs a reset"
    rows = _supported(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(h))
    if rows and (rows[2] or rows[3]):  # (corrected, uncorrected, pending, failure)
        return f"GPU {gpu} has row remapping {'failed' if rows[3] else 'pending'}: it needs a reset"
    return ""


def _supported(nvml: Any, read: Callable[[], Any]) -> Any:
    """A reading, or None on GPUs without that feature (ECC off, pre-Ampere row remapping)."""
    try:
        return read()
    except nvml.NVMLError_NotSupported:
        return None


def _wait_memory_freed(
    nvml: Any,
    handles: dict[str, Any],
    pids: set[int],
    limit: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> str:
    """Wait up to `limit` s until no GPU lists one of the last round's workers as a process."""
    if not pids:
        return ""
    deadline, told = clock() + limit, False
    while True:
        held = {
            gpu: sorted(p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid in pids)
            for gpu, h in handles.items()
        }
        held = {gpu: p for gpu, p in held.items() if p}
        if not held:
            return ""
        if not told:
            log.info(f"waiting up to {limit:g} s for the last workers' GPU memory to be freed ({', '.join(held)})")
            told = True
        if clock() >= deadline:
            gpu, who = next(iter(held.items()))
            pids_text = ", ".join(map(str, who))
            return (
                f"GPU {gpu} still holds the memory of the last workers (pid {pids_text}) {limit:g} s after they ended"
            )
        sleep(POLL)
