"""--numa_binding against fake sysfs trees: GPU -> PCI -> NUMA node -> CPUs, for each of torch's modes.

The expectations are torch 2.13's (torch/numa/binding.py) worked out by hand for each machine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher.agent.numa import (
    Binding,
    NumaBound,
    NumaError,
    Topology,
    cpus_for,
    format_cpulist,
    parse_cpulist,
    visible_gpus,
)
from launcher.agent.process import inherited_affinity
from launcher.errors import ConfigError
from launcher.parsers import parse_numa_binding
from launcher.spec import NumaMode

# ---------------------------------------------------------------------------- a fake machine


@dataclass
class Node:
    socket: int
    cores: list[list[int]]  # physical cores, each its hyperthreads
    ccx: int = 0  # cores per last-level cache (0: one cache for the whole node)


@dataclass
class Machine:
    nodes: dict[int, Node]
    gpus: list[tuple[str, int]]  # (PCI address, numa_node as sysfs writes it)
    driver: bool = True  # /proc/driver/nvidia/gpus present
    models: list[str] = field(default_factory=list)
    extra_pci: dict[str, tuple[str, str]] = field(default_factory=dict)  # address -> (vendor, class)


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


def build(root: Path, m: Machine) -> Path:
    def write(path: str, text: str) -> None:
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    write("sys/devices/system/node/possible", format_cpulist(m.nodes))
    for n, node in m.nodes.items():
        cpus = [c for core in node.cores for c in core]
        write(f"sys/devices/system/node/node{n}/cpulist", format_cpulist(cpus))
        per = node.ccx or len(node.cores)
        for i, core in enumerate(node.cores):
            group = node.cores[i - i % per : i - i % per + per]
            llc = [c for k in group for c in k]
            for cpu in core:
                base = f"sys/devices/system/cpu/cpu{cpu}"
                write(f"{base}/topology/physical_package_id", str(node.socket))
                write(f"{base}/topology/thread_siblings_list", format_cpulist(core))
                write(f"{base}/cache/index0/type", "Data")
                write(f"{base}/cache/index0/level", "1")
                write(f"{base}/cache/index0/shared_cpu_list", format_cpulist(core))
                write(f"{base}/cache/index1/type", "Instruction")
                write(f"{base}/cache/index1/level", "4")  # not a data cache: never the last level
                write(f"{base}/cache/index1/shared_cpu_list", format_cpulist(cpus))
                write(f"{base}/cache/index3/type", "Unified")
                write(f"{base}/cache/index3/level", "3")
                write(f"{base}/cache/index3/shared_cpu_list", format_cpulist(llc))
    for i, (pci, numa_node) in enumerate(m.gpus):
        write(f"sys/bus/pci/devices/{pci}/vendor", "0x10de")
        write(f"sys/bus/pci/devices/{pci}/class", "0x030200")
        write(f"sys/bus/pci/devices/{pci}/numa_node", str(numa_node))
        if m.driver:
            model = m.models[i] if m.models else "NVIDIA H100 80GB HBM3"
            write(f"proc/driver/nvidia/gpus/{pci}/information", f"Model: \t\t {model}\nGPU UUID: \t {uuid(i)}\n")
    for pci, (vendor, cls) in m.extra_pci.items():
        write(f"sys/bus/pci/devices/{pci}/vendor", vendor)
        write(f"sys/bus/pci/devices/{pci}/class", cls)
        write(f"sys/bus/pci/devices/{pci}/numa_node", "0")
    return root


def cores(first: int, n: int, ht: int) -> list[list[int]]:
    """`n` physical cores from CPU `first`, hyperthread siblings `ht` apart (Linux numbering)."""
    return [[first + i, first + i + ht] for i in range(n)]


# Two sockets, two NUMA nodes each, 4 cores per node with hyperthreads (CPU c and c+16 share a core),
# a last-level cache per 2 cores, 8 GPUs two per node listed out of PCI order, and a memory-only node 4.
DGX_LIKE = Machine(
    nodes={
        0: Node(0, cores(0, 4, 16), ccx=2),
        1: Node(0, cores(4, 4, 16), ccx=2),
        2: Node(1, cores(8, 4, 16), ccx=2),
        3: Node(1, cores(12, 4, 16), ccx=2),
        4: Node(1, []),
    },
    gpus=[(f"0000:{bus:02x}:00.0", n) for bus, n in ((0xDB, 3), (0x1B, 0), (0x29, 0), (0x4C, 1), (0x5D, 1))]
    + [(f"0000:{bus:02x}:00.0", n) for bus, n in ((0x9B, 2), (0xBB, 2), (0xCB, 3))],
)
ALL = frozenset(range(32))


@pytest.fixture(scope="module")
def dgx_root(tmp_path_factory) -> str:
    return str(build(tmp_path_factory.mktemp("dgx"), DGX_LIKE))


@pytest.fixture
def dgx(dgx_root) -> Topology:
    return Topology(dgx_root, allowed=ALL)


def worker(local_rank: int, visible: str | None = None) -> dict[str, str]:
    env = {"LOCAL_RANK": str(local_rank)}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


# ---------------------------------------------------------------------------- reading the machine


def test_cpulists_parse_and_format_as_the_kernel_writes_them():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == frozenset()
    assert format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert format_cpulist([5]) == "5" and format_cpulist([]) == ""


def test_gpus_in_pci_bus_order_with_their_numa_node_and_uuid(dgx):
    gpus = dgx.gpus()
    assert [g.pci for g in gpus] == sorted(g.pci for g in gpus) and len(gpus) == 8
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert gpus[0].uuid == uuid(1)  # 0000:1b is the second in the tree's listing, the first on the bus
    assert gpus[0].model == "NVIDIA H100 80GB HBM3"


def test_without_the_driver_files_nvidia_display_devices_are_the_gpus(tmp_path):
    m = Machine(
        nodes={0: Node(0, cores(0, 2, 2))},
        gpus=[("0000:3b:00.0", -1)],  # one-node firmware: -1 means node 0
        driver=False,
        extra_pci={"0000:3b:00.1": ("0x10de", "0x040300"), "0000:00:02.0": ("0x8086", "0x030000")},
    )
    topo = Topology(str(build(tmp_path, m)), allowed=range(4))
    assert [(g.pci, g.numa_node, g.uuid) for g in topo.gpus()] == [("0000:3b:00.0", 0, "")]


# ---------------------------------------------------------------------------- the modes


def test_node_binds_the_gpus_numa_node(dgx):
    gpus = dgx.gpus()
    assert cpus_for(NumaMode.NODE, gpus[0], gpus, dgx) == {0, 1, 2, 3, 16, 17, 18, 19}
    assert cpus_for(NumaMode.NODE, gpus[7], gpus, dgx) == {12, 13, 14, 15, 28, 29, 30, 31}


def test_socket_binds_every_node_of_the_gpus_socket_memory_only_nodes_aside(dgx):
    gpus = dgx.gpus()
    assert cpus_for(NumaMode.SOCKET, gpus[2], gpus, dgx) == set(range(0, 8)) | set(range(16, 24))
    assert cpus_for(NumaMode.SOCKET, gpus[5], gpus, dgx) == set(range(8, 16)) | set(range(24, 32))


def test_exclusive_splits_the_nodes_cores_between_its_gpus_hyperthreads_with_their_core(dgx):
    gpus = dgx.gpus()
    assert cpus_for(NumaMode.EXCLUSIVE, gpus[0], gpus, dgx) == {0, 1, 16, 17}
    assert cpus_for(NumaMode.EXCLUSIVE, gpus[1], gpus, dgx) == {2, 3, 18, 19}
    # only the GPUs the node's workers use share the node: alone on it, GPU 0 gets all of it
    assert cpus_for(NumaMode.EXCLUSIVE, gpus[0], gpus[:1], dgx) == {0, 1, 2, 3, 16, 17, 18, 19}


def test_exclusive_gives_the_lower_gpus_the_cores_left_over(tmp_path):
    m = Machine(nodes={0: Node(0, cores(0, 4, 4))}, gpus=[(f"0000:{b}:00.0", 0) for b in ("1b", "29", "4c")])
    topo = Topology(str(build(tmp_path, m)), allowed=range(8))
    gpus = topo.gpus()
    assert [cpus_for(NumaMode.EXCLUSIVE, g, gpus, topo) for g in gpus] == [{0, 1, 4, 5}, {2, 6}, {3, 7}]


def test_exclusive_with_fewer_cores_than_gpus_is_an_error_naming_node_mode(tmp_path):
    m = Machine(nodes={0: Node(0, cores(0, 1, 1))}, gpus=[("0000:1b:00.0", 0), ("0000:29:00.0", 0)])
    topo = Topology(str(build(tmp_path, m)), allowed=range(2))
    with pytest.raises(NumaError, match="1 physical core.* for 2 GPUs; use --numa_binding node"):
        cpus_for(NumaMode.EXCLUSIVE, topo.gpus()[1], topo.gpus(), topo)


def test_core_complex_gives_each_gpu_its_own_last_level_cache(dgx):
    gpus = dgx.gpus()
    assert cpus_for(NumaMode.CORE_COMPLEX, gpus[0], gpus, dgx) == {0, 1, 16, 17}
    assert cpus_for(NumaMode.CORE_COMPLEX, gpus[1], gpus, dgx) == {2, 3, 18, 19}


def test_core_complex_takes_the_largest_caches_first_and_wraps_round(tmp_path):
    # node 0: caches of 2, 2 and 1 cores (5 cores, 2 per cache); 4 GPUs on it
    m = Machine(nodes={0: Node(0, [[c] for c in range(5)], ccx=2)}, gpus=[(f"0000:{b}:00.0", 0) for b in range(10, 14)])
    topo = Topology(str(build(tmp_path, m)), allowed=range(5))
    got = [cpus_for(NumaMode.CORE_COMPLEX, g, topo.gpus(), topo) for g in topo.gpus()]
    assert got == [{0, 1}, {2, 3}, {4}, {0, 1}]


def test_only_cpus_the_agent_may_use_count(dgx_root):
    topo = Topology(dgx_root, allowed={1, 2, 3, 17, 18, 19})  # e.g. taskset or a cgroup
    gpus = topo.gpus()
    assert cpus_for(NumaMode.NODE, gpus[0], gpus, topo) == {1, 2, 3, 17, 18, 19}
    assert cpus_for(NumaMode.EXCLUSIVE, gpus[0], gpus, topo) == {1, 2, 17, 18}
    assert cpus_for(NumaMode.SOCKET, gpus[0], gpus, topo) == {1, 2, 3, 17, 18, 19}


# ---------------------------------------------------------------------------- which GPU a worker has


def test_cuda_visible_devices_indices_uuids_and_the_first_bad_entry(dgx):
    pcis = [g.pci for g in dgx.gpus()]
    assert [g.pci for g in visible_gpus(dgx, "6,7")] == pcis[6:8]
    assert [g.pci for g in visible_gpus(dgx, f"{uuid(1)[:12]},3")] == [pcis[0], pcis[3]]
    assert visible_gpus(dgx, "-1") == () and visible_gpus(dgx, "") == ()
    assert [g.pci for g in visible_gpus(dgx, "2,9,3")] == [pcis[2]]  # CUDA stops at an id that names no GPU
    assert len(visible_gpus(dgx, None)) == 8
    with pytest.raises(NumaError, match="MIG"):
        visible_gpus(dgx, "MIG-4a2b")


def test_a_worker_binds_to_the_local_rank_th_gpu_of_its_own_visible_list(dgx):
    binding = Binding(NumaMode.NODE, dgx, dgx.gpus())
    assert binding.cpus(worker(0)) == {0, 1, 2, 3, 16, 17, 18, 19}
    assert binding.cpus(worker(3)) == {4, 5, 6, 7, 20, 21, 22, 23}
    assert binding.cpus(worker(1, "7,5")) == {8, 9, 10, 11, 24, 25, 26, 27}


def test_gpus_and_virtual_local_rank_bind_the_gpu_the_worker_sees(dgx, caplog):
    # --gpus 4,5: every worker sees "4,5" (physical ids); --virtual_local_rank: each sees its one GPU as 0
    binding = Binding.create(NumaMode.EXCLUSIVE, {}, gpus=("4", "5"), topology=dgx)
    assert binding.cpus(worker(0, "4,5")) == {8, 9, 24, 25}
    assert binding.cpus(worker(1, "4,5")) == {10, 11, 26, 27}
    virtual = Binding.create(NumaMode.EXCLUSIVE, {"CUDA_VISIBLE_DEVICES": "4,5"}, topology=dgx)
    assert virtual.cpus(worker(0, "5")) == {10, 11, 26, 27}
    assert not caplog.records


def test_a_worker_without_a_gpu_runs_unbound_said_once(dgx, caplog):
    binding = Binding(NumaMode.NODE, dgx, dgx.gpus())
    with caplog.at_level(logging.WARNING, logger="launcher.agent.numa"):
        assert binding.cpus(worker(2, "0,1")) == frozenset()
        assert binding.cpus(worker(2, "0,1")) == frozenset()
    assert [r.getMessage() for r in caplog.records] == [
        "--numa_binding node: local rank 2 has no GPU (2 visible); that worker runs unbound"
    ]


def test_a_machine_without_a_gpu_says_so_in_one_line(tmp_path, caplog):
    topo = Topology(str(build(tmp_path, Machine(nodes={0: Node(0, cores(0, 2, 2))}, gpus=[]))), allowed=range(4))
    with caplog.at_level(logging.WARNING, logger="launcher.agent.numa"):
        assert Binding.create(NumaMode.SOCKET, {}, topology=topo) is None
    assert [r.getMessage() for r in caplog.records] == [
        "--numa_binding socket: no NVIDIA GPU on this machine; the workers run unbound"
    ]


def test_mixed_models_are_told_to_order_by_pci_bus(tmp_path, caplog):
    m = Machine(
        nodes={0: Node(0, cores(0, 2, 2))},
        gpus=[("0000:1b:00.0", 0), ("0000:29:00.0", 0)],
        models=["NVIDIA A100", "NVIDIA T4"],
    )
    topo = Topology(str(build(tmp_path, m)), allowed=range(4))
    with caplog.at_level(logging.WARNING, logger="launcher.agent.numa"):
        Binding.create(NumaMode.NODE, {}, topology=topo)
        Binding.create(NumaMode.NODE, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, topology=topo)
    assert len(caplog.records) == 1 and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------- the flag and the starter


@pytest.mark.parametrize("text", ["node", "socket", "exclusive", "core-complex", "NODE"])
def test_the_four_modes_parse(text):
    assert parse_numa_binding(text) is NumaMode(text.lower())


def test_no_mode_is_no_binding_and_a_bad_one_names_the_modes():
    assert parse_numa_binding(None) is None and parse_numa_binding("") is None
    with pytest.raises(ConfigError, match="use one of node, socket, exclusive, core-complex"):
        parse_numa_binding("numa")


class Recorder:
    """A Starter that records what it was asked to start."""

    def __init__(self):
        self.started: list[tuple[dict, frozenset[int]]] = []
        self.closed = False

    def start(self, argv, env, cpus=frozenset()):
        self.started.append((env, cpus))
        return None

    def helpers(self):
        return (42,)

    def check(self):
        pass

    def close(self):
        self.closed = True


def test_numa_bound_hands_each_worker_its_cpus_and_passes_the_rest_through(dgx):
    inner = Recorder()
    bound = NumaBound(inner, Binding(NumaMode.NODE, dgx, dgx.gpus()))
    bound.start(["python", "train.py"], worker(2))
    bound.start(["python", "train.py"], worker(0, "-1"))
    assert [cpus for _, cpus in inner.started] == [{4, 5, 6, 7, 20, 21, 22, 23}, frozenset()]
    assert bound.helpers() == (42,)
    bound.close()
    assert inner.closed


def test_the_spawning_thread_holds_the_cpus_for_the_spawn_only(caplog):
    before = os.sched_getaffinity(0)
    one = frozenset({max(before)})
    with inherited_affinity(one):
        assert os.sched_getaffinity(0) == one  # what a process started here inherits
    assert os.sched_getaffinity(0) == before
    with inherited_affinity(frozenset()):
        assert os.sched_getaffinity(0) == before
    with caplog.at_level(logging.WARNING, logger="launcher.agent.process"), inherited_affinity(frozenset({1 << 20})):
        assert os.sched_getaffinity(0) == before  # no such CPU: said, and the worker starts unbound
    assert os.sched_getaffinity(0) == before
    assert len(caplog.records) == 1 and "runs unbound" in caplog.records[0].getMessage()
