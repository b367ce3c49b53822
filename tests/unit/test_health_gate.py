"""The built-in GPU checks of the health gate, through the NVML seam (`HealthGate(nvml=...)`).

No NVIDIA GPU or driver here: `FakeNvml` answers the few pynvml calls the gate makes, with the
same names, constants and exceptions. The real pynvml is never imported by these tests.
"""

from __future__ import annotations

from types import SimpleNamespace

from support.clock import FakeClock

from launcher.policy.governor import gate_from
from launcher.policy.health import HealthGate


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801  (pynvml's own name)
    pass


class FakeGpu:
    def __init__(self, uuid: str, ecc: int = 0, pending: bool = False, rows=(0, 0, 0, 0), pids=(), ecc_supported=True):
        self.uuid, self.ecc, self.pending, self.rows, self.pids = uuid, ecc, pending, rows, list(pids)
        self.ecc_supported = ecc_supported


class FakeNvml:
    """pynvml's surface as the gate uses it; `gpus` are the devices the driver lists."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FEATURE_ENABLED = 1

    def __init__(self, *gpus: FakeGpu):
        self.gpus = list(gpus)

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise NVMLError("Not Found")

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert (kind, counter) == (1, 0)
        if not h.ecc_supported:
            raise NVMLError_NotSupported("Not Supported")
        return h.ecc

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return int(h.pending)

    def nvmlDeviceGetRemappedRows(self, h):
        return h.rows

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in h.pids]


def gate(nvml: FakeNvml, gpus=(), clock=None, sleep=lambda s: None) -> HealthGate:
    clock = clock or FakeClock(0.0)
    return HealthGate(None, gpus=gpus, nvml=lambda: nvml, memory_wait=30, clock=clock, sleep=sleep)


def test_healthy_gpus_pass():
    assert gate(FakeNvml(FakeGpu("GPU-a"), FakeGpu("GPU-b")), gpus=("0", "1")).check([1234]) == ""


def test_a_gpu_the_node_should_have_but_does_not_see_keeps_it_out():
    nvml = FakeNvml(FakeGpu("GPU-a"))
    assert gate(nvml, gpus=("0", "1")).check() == "GPU 1 is not visible (NVML lists 1 GPU(s))"
    assert gate(nvml, gpus=("GPU-zz",)).check() == "GPU GPU-zz is not visible (NVML lists 1 GPU(s))"
    assert gate(nvml, gpus=("GPU-a",)).check() == ""


def test_uncorrected_ecc_errors_keep_the_node_out():
    nvml = FakeNvml(FakeGpu("GPU-a"), FakeGpu("GPU-b", ecc=2))
    assert gate(nvml).check() == "GPU 1 has 2 uncorrected ECC error(s) since the driver loaded"


def test_pending_page_retirement_or_row_remapping_keeps_the_node_out():
    assert gate(FakeNvml(FakeGpu("GPU-a", pending=True))).check() == "GPU 0 has retired pages pending: it needs a reset"
    rows = FakeNvml(FakeGpu("GPU-a", rows=(3, 0, 1, 0)))
    assert gate(rows).check() == "GPU 0 has row remapping pending: it needs a reset"


def test_a_gpu_without_ecc_is_not_held_against_the_node():
    assert gate(FakeNvml(FakeGpu("GPU-a", ecc_supported=False))).check() == ""


def test_the_last_workers_memory_is_waited_for_then_the_gate_opens():
    gpu = FakeGpu("GPU-a", pids=[4321, 999])  # 999 is another job's process: none of ours
    clock = FakeClock(0.0)

    def sleep(seconds):
        clock.now += seconds
        if clock.now >= 3:
            gpu.pids.remove(4321)  # the driver released the dead worker's context

    assert gate(FakeNvml(gpu), clock=clock, sleep=sleep).check([4321]) == ""
    assert clock.now == 3.0


def test_memory_never_freed_keeps_the_node_out_after_the_bound():
    clock = FakeClock(0.0)

    def sleep(seconds):
        clock.now += seconds

    problem = gate(FakeNvml(FakeGpu("GPU-a", pids=[4321])), clock=clock, sleep=sleep).check([4321])
    assert problem == "GPU 0 still holds the memory of the last workers (pid 4321) 30 s after they ended"
    assert 30 <= clock.now <= 31


def test_no_nvml_means_no_gpu_checks():
    assert HealthGate(None, nvml=lambda: None).check([1]) == ""


def test_the_gate_checks_the_gpus_the_workers_use():
    assert gate_from(None, 60, ("2", "3"), {"CUDA_VISIBLE_DEVICES": "0"}).gpus == ("2", "3")
    assert gate_from(None, 60, (), {"CUDA_VISIBLE_DEVICES": "1,GPU-x"}).gpus == ("1", "GPU-x")
    assert gate_from(None, 60, (), {}).gpus == ()
