"""The zygote tells a CUDA driver that is only loaded (safe to fork) from one that is initialised.

A stand-in libcuda.so.1 (built here with the C compiler) answers cuDeviceGetCount as the real driver
does: CUDA_ERROR_NOT_INITIALIZED (3) before cuInit, 0 after. Each case runs in a fresh interpreter,
since a loaded library stays mapped for the life of a process.
"""

import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

DRIVER = """
static int initialised = 0;
int cuInit(unsigned int flags) { initialised = 1; return 0; }
int cuDeviceGetCount(int *count) { if (!initialised) return 3; *count = 1; return 0; }
"""

PROBE = """
import ctypes, sys
from launcher.agent.zygote.server import _cuda_driver_initialised
print(repr(_cuda_driver_initialised()))
driver = ctypes.CDLL(sys.argv[1])
if sys.argv[2] == "init":
    driver.cuInit(0)
print(repr(_cuda_driver_initialised()))
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    d = tmp_path_factory.mktemp("cuda")
    (d / "cuda.c").write_text(DRIVER)
    lib = d / "libcuda.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, d / "cuda.c"], check=True)
    return lib


def probe(lib, mode):
    out = subprocess.run([sys.executable, "-c", PROBE, str(lib), mode], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [eval(line) for line in out.stdout.splitlines()]


def test_a_driver_loaded_but_not_initialised_is_safe_to_fork(fake_driver):
    # torch 2.11+cu130 maps libcuda at import and never calls cuInit until asked: --preload must fork
    assert probe(fake_driver, "load") == ["", ""]


def test_an_initialised_driver_is_named(fake_driver):
    before, after = probe(fake_driver, "init")
    assert before == ""
    assert "initialised the CUDA driver (cuInit)" in after
