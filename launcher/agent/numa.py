"""`--numa_binding`: each worker runs on the CPUs near its GPU, as torchrun's modes define them.

The agent reads the machine from sysfs and the NVIDIA driver's /proc files (no torch, no NVML, no
numactl): the GPUs' PCI addresses, each one's NUMA node, the nodes' CPUs, sockets, physical cores
and last-level caches. A worker's GPU is the one `torch.cuda.set_device(LOCAL_RANK)` picks: the
LOCAL_RANK-th device of its own CUDA_VISIBLE_DEVICES (all GPUs when unset), so `--gpus` and
`--virtual_local_rank` bind the right device. The CPU set is then applied in the worker before it
runs anything: a spawned worker inherits it from the thread that starts it, a forked one sets it
itself (`zygote.server`). torch's modes (torch/numa/binding.py, 2.13):

- node: every CPU of the GPU's NUMA node.
- socket: every CPU of every NUMA node on the GPU's socket.
- exclusive: the node's physical cores split evenly between the node's GPUs, lower GPUs first
  taking one extra core when they do not divide; hyperthreads stay with their core.
- core-complex: one last-level-cache group (an AMD CCX, say) of the node per GPU, the largest
  groups first, round-robin when GPUs outnumber them.

Only CPUs the agent may use count (its own affinity, e.g. under taskset or a Slurm cgroup).
Anything that stops a worker's binding (no GPU, a CUDA_VISIBLE_DEVICES entry that names no GPU)
is said in one line and the worker runs unbound, as torchrun's `should_fall_back_if_binding_fails`.
CUDA numbers devices fastest first; sysfs cannot rank speed, so indices are taken in PCI bus order,
which is CUDA's on a node of identical GPUs (mixed models are warned to set CUDA_DEVICE_ORDER).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..spec import NumaMode

if TYPE_CHECKING:  # config imports this module for the flag: keep its imports light
    from .process import Starter, WorkerProcess

log = logging.getLogger(__name__)

NVIDIA = "0x10de"
SYSFS_ROOT = "/"  # where /sys and /proc are read; tests point it at a fake machine


class NumaError(Exception):
    """A worker cannot be bound; the message says why, in one line."""


def parse_cpulist(text: str) -> frozenset[int]:
    """A kernel CPU list ("0-3,8,10-11") → its CPUs."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The other way: {0, 1, 2, 3, 8} → "0-3,8"."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs)


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as the kernel sees it."""

    pci: str  # "0000:1b:00.0"
    numa_node: int  # 0 where the firmware does not say (-1 in sysfs)
    uuid: str = ""  # "GPU-…", from the driver's /proc file
    model: str = ""


class Topology:
    """The machine as sysfs and /proc describe it, read under `root` (tests pass a fake tree)."""

    def __init__(self, root: str | None = None, allowed: Iterable[int] | None = None):
        self.root = root or SYSFS_ROOT
        self.allowed = frozenset(os.sched_getaffinity(0) if allowed is None else allowed)

    def _read(self, path: str) -> str:
        with open(os.path.join(self.root, path.lstrip("/"))) as f:
            return f.read().strip()

    @cache  # noqa: B019 -- one Topology per agent, read once
    def gpus(self) -> tuple[Gpu, ...]:
        """The NVIDIA GPUs in PCI bus order: those the driver lists, else every NVIDIA display device."""
        try:
            addresses = os.listdir(os.path.join(self.root, "proc/driver/nvidia/gpus"))
        except OSError:
            addresses = [a for a in self._list("sys/bus/pci/devices") if self._is_nvidia_gpu(a)]
        return tuple(self._gpu(a.lower()) for a in sorted(addresses, key=str.lower))

    def _list(self, path: str) -> list[str]:
        try:
            return os.listdir(os.path.join(self.root, path))
        except OSError:
            return []

    def _is_nvidia_gpu(self, address: str) -> bool:
        try:
            vendor = self._read(f"sys/bus/pci/devices/{address}/vendor")
            return vendor == NVIDIA and self._read(f"sys/bus/pci/devices/{address}/class").startswith("0x03")
        except OSError:
            return False

    def _gpu(self, address: str) -> Gpu:
        try:
            node = max(int(self._read(f"sys/bus/pci/devices/{address}/numa_node")), 0)
        except (OSError, ValueError):
            node = 0  # one-node machines often say -1, or nothing
        info: dict[str, str] = {}
        try:
            for line in self._read(f"proc/driver/nvidia/gpus/{address}/information").splitlines():
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
        except OSError:
            pass
        return Gpu(address, node, info.get("GPU UUID", ""), info.get("Model", ""))

    def node_cpus(self, node: int) -> frozenset[int]:
        """The CPUs of NUMA node `node` that this process may use."""
        try:
            return parse_cpulist(self._read(f"sys/devices/system/node/node{node}/cpulist")) & self.allowed
        except OSError:
            raise NumaError(f"NUMA node {node} has no CPU list in /sys/devices/system/node") from None

    def nodes(self) -> frozenset[int]:
        try:
            return parse_cpulist(self._read("sys/devices/system/node/possible"))
        except OSError:
            return frozenset({0})

    def _cpu_file(self, cpu: int, name: str) -> str:
        try:
            return self._read(f"sys/devices/system/cpu/cpu{cpu}/{name}")
        except OSError:
            raise NumaError(f"CPU {cpu} has no {name} in /sys/devices/system/cpu") from None

    def socket_of(self, cpu: int) -> int:
        return int(self._cpu_file(cpu, "topology/physical_package_id"))

    def core_of(self, cpu: int) -> int:
        """The physical core `cpu` is a hyperthread of, named by its lowest CPU."""
        return min(parse_cpulist(self._cpu_file(cpu, "topology/thread_siblings_list")))

    def llc_of(self, cpu: int) -> int:
        """The last-level cache `cpu` shares (the highest data or unified level), named by its lowest CPU."""
        folder = f"sys/devices/system/cpu/cpu{cpu}/cache"
        best = (-1, frozenset({cpu}))
        for entry in self._list(folder):
            if not (entry.startswith("index") and entry[5:].isdecimal()):
                continue
            if self._read(f"{folder}/{entry}/type") not in ("Unified", "Data"):
                continue
            level = int(self._read(f"{folder}/{entry}/level"))
            if level > best[0]:
                best = (level, parse_cpulist(self._read(f"{folder}/{entry}/shared_cpu_list")))
        return min(best[1])


def visible_gpus(topology: Topology, visible: str | None) -> tuple[Gpu, ...]:
    """The GPUs a CUDA_VISIBLE_DEVICES value shows, in its order (None: all of them).

    As CUDA reads it: indices or GPU UUIDs (a unique prefix will do), and the list ends at the
    first entry that names no GPU ("-1" hides every device)."""
    gpus = topology.gpus()
    if visible is None:
        return gpus
    shown: list[Gpu] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith("MIG-"):
            raise NumaError(f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}), which sysfs cannot place on a GPU")
        if entry.isdecimal():
            found = [gpus[int(entry)]] if int(entry) < len(gpus) else []
        else:
            found = [g for g in gpus if g.uuid and entry and g.uuid.startswith(entry)]
        if len(found) != 1 or found[0] in shown:
            break
        shown.append(found[0])
    return tuple(shown)


def cpus_for(mode: NumaMode, gpu: Gpu, peers: Sequence[Gpu], topology: Topology) -> frozenset[int]:
    """The CPUs `mode` gives the worker of `gpu`; `peers` are every GPU the node's workers use."""
    node_cpus = topology.node_cpus(gpu.numa_node)
    if mode is NumaMode.SOCKET:
        if not node_cpus:
            raise NumaError(f"NUMA node {gpu.numa_node} (GPU {gpu.pci}) has no CPU this process may use")
        socket = topology.socket_of(min(node_cpus))
        cpus = set()
        for node in topology.nodes():
            mine = topology.node_cpus(node)
            if mine and topology.socket_of(min(mine)) == socket:  # memory-only nodes have no CPU
                cpus |= mine
        return frozenset(cpus)
    if mode in (NumaMode.EXCLUSIVE, NumaMode.CORE_COMPLEX):
        siblings = sorted({g for g in peers if g.numa_node == gpu.numa_node} | {gpu}, key=lambda g: g.pci)
        position = siblings.index(gpu)
        if mode is NumaMode.EXCLUSIVE:
            return _share(_group(node_cpus, topology.core_of), position, len(siblings), gpu)
        caches = _group(node_cpus, topology.llc_of)
        caches.sort(key=lambda group: (-len(group), min(group)))
        if not caches:
            raise NumaError(f"NUMA node {gpu.numa_node} (GPU {gpu.pci}) has no CPU this process may use")
        return caches[position % len(caches)]
    return node_cpus


def _group(cpus: frozenset[int], key: Callable[[int], int]) -> list[frozenset[int]]:
    """CPUs grouped by `key` (a core, a cache), the groups in the order of their key."""
    groups: dict[int, set[int]] = {}
    for cpu in cpus:
        groups.setdefault(key(cpu), set()).add(cpu)
    return [frozenset(groups[k]) for k in sorted(groups)]


def _share(cores: list[frozenset[int]], position: int, shares: int, gpu: Gpu) -> frozenset[int]:
    """The `position`-th of `shares` even slices of `cores`; the first `len % shares` get one more."""
    each, extra = divmod(len(cores), shares)
    if each < 1:
        raise NumaError(
            f"NUMA node {gpu.numa_node} has {len(cores)} physical core(s) for {shares} GPUs; use --numa_binding node"
        )
    start = position * each + min(position, extra)
    end = start + each + (1 if position < extra else 0)
    return frozenset(cpu for core in cores[start:end] for cpu in core)


class Binding:
    """Which CPUs each worker gets, decided in the agent from the worker's environment."""

    def __init__(self, mode: NumaMode, topology: Topology, peers: Sequence[Gpu]):
        self.mode = mode
        self.topology = topology
        self.peers = tuple(peers)  # the GPUs the node's workers may use (exclusive and core-complex share them)
        self._said: set[str] = set()

    @classmethod
    def create(
        cls, mode: NumaMode, environ: Mapping[str, str], gpus: Sequence[str] = (), topology: Topology | None = None
    ) -> Binding | None:
        """The binding for this node; None (said in one line) where the machine has no NVIDIA GPU."""
        topology = topology or Topology()
        if not topology.gpus():
            log.warning(f"--numa_binding {mode.value}: no NVIDIA GPU on this machine; the workers run unbound")
            return None
        visible = ",".join(gpus) if gpus else environ.get("CUDA_VISIBLE_DEVICES")
        try:
            peers = visible_gpus(topology, visible)
        except NumaError as e:
            log.warning(f"--numa_binding {mode.value}: {e}; the workers run unbound")
            return None
        models = {g.model for g in peers if g.model}
        if len(models) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and not gpus:
            log.warning(
                f"--numa_binding: GPUs of {len(models)} models; set CUDA_DEVICE_ORDER=PCI_BUS_ID so that "
                "CUDA numbers them as the binding does (PCI bus order)"
            )
        return cls(mode, topology, peers)

    def cpus(self, env: Mapping[str, str]) -> frozenset[int]:
        """The worker's CPUs (empty: unbound, the reason said once)."""
        try:
            return self._cpus(env.get("CUDA_VISIBLE_DEVICES"), int(env.get("LOCAL_RANK", "0")))
        except NumaError as e:
            message = f"--numa_binding {self.mode.value}: {e}; that worker runs unbound"
            if message not in self._said:
                self._said.add(message)
                log.warning(message)
            return frozenset()

    @cache  # noqa: B019 -- one Binding per agent: a worker's CPUs are worked out once, not every restart
    def _cpus(self, visible: str | None, local_rank: int) -> frozenset[int]:
        shown = visible_gpus(self.topology, visible)
        if local_rank >= len(shown):
            raise NumaError(f"local rank {local_rank} has no GPU ({len(shown)} visible)")
        gpu = shown[local_rank]
        cpus = cpus_for(self.mode, gpu, self.peers, self.topology)
        if not cpus:
            raise NumaError(f"NUMA node {gpu.numa_node} (GPU {gpu.pci}) has no CPU this process may use")
        log.debug(
            "numa_binding %s: GPU %s (NUMA node %d) -> CPUs %s",
            self.mode.value,
            gpu.pci,
            gpu.numa_node,
            format_cpulist(cpus),
        )
        return cpus


class NumaBound:
    """A `Starter` that starts each worker of another on its GPU's CPUs."""

    def __init__(self, inner: Starter, binding: Binding):
        self.inner = inner
        self.binding = binding

    def start(self, argv: Sequence[str], env: dict[str, str], cpus: frozenset[int] = frozenset()) -> WorkerProcess:
        return self.inner.start(argv, env, cpus or self.binding.cpus(env))

    def helpers(self) -> tuple[int, ...]:
        return self.inner.helpers()

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()
