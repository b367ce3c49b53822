"""A spawned worker's quick exit (`python -u …/launcher/agent/worker_exit.py SCRIPT`) behaves as `python -u SCRIPT`.

Each script runs both ways, side by side; what the user can see must be the same: argv, `sys.path[0]`,
`__main__`, stdout and stderr (tracebacks included), the exit status, a death by signal, an uncaught
KeyboardInterrupt, `-m MODULE`, multiprocessing's spawn, and what finalisation would have written
(a file another module's global holds, never closed).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import ROOT

QUICK = (sys.executable, "-u", str(ROOT / "launcher" / "agent" / "worker_exit.py"))
PLAIN = (sys.executable, "-u")

SCRIPTS = {
    "main": """
import os, sys
spec = (__spec__.name, __spec__.origin) if __spec__ else None
print(sys.argv, sys.path[0] == os.path.dirname(os.path.realpath(__file__)), __name__, __file__, spec)
print(sorted(k for k in globals() if k.startswith("__")), __package__, __cached__)
""",
    "exit_code": "import sys; print('bye'); sys.exit(int(sys.argv[1]))",
    "exit_message": "import sys; sys.exit('a message, status 1')",
    "uncaught": """
def inner():
    raise ValueError("boom")
print("before", flush=True)
inner()
""",
    "keyboard_interrupt": "import os, signal; os.kill(os.getpid(), signal.SIGINT)",
    "sigterm": "import os, signal; print('dying', flush=True); os.kill(os.getpid(), signal.SIGTERM)",
    "mp_spawn": """
import multiprocessing as mp

def square(x):
    return x * x

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print(pool.map(square, [1, 2, 3]))
""",
    "module_global_file": """
import sys
sys.path.insert(0, sys.argv[1])
import holder  # opens a file at import and never closes it
holder.out.write("held by another module's global\\n")
print("returned")
""",
    "c_file": """
import ctypes
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
f = libc.fopen(b"c_file.txt", b"w")  # C's own buffer: only the C runtime's exit flushes it
libc.fputs(b"written by C, never closed\\n", ctypes.c_void_p(f))
print("returned")
""",
    "computed_class": """
import sys, types

class Deprecated:  # as torch.distributed.reduce_op: reading its __class__ warns
    @property
    def __class__(self):
        import warnings  # (__main__'s globals may be gone by the exit)

        warnings.warn("__class__ read", FutureWarning)
        return type(self)

elsewhere = sys.modules["elsewhere"] = types.ModuleType("elsewhere")
elsewhere.kept = Deprecated()  # a module's global: alive at the exit
print("returned")
""",
    "atexit_and_del": """
import atexit

class Noisy:
    def __del__(self):
        print("__del__ of a global ran")

noisy = Noisy()
atexit.register(print, "atexit ran")
print("returned")
""",
}
HOLDER = "import os\nout = open(os.path.join(os.path.dirname(__file__), 'held.txt'), 'w')\n"


def run_both(tmp_path, name: str, *args: str, module: bool = False):
    """(plain, quick) CompletedProcess of one script, each in its own fresh folder."""
    results = []
    for kind, prefix in (("plain", PLAIN), ("quick", QUICK)):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / f"{name}.py").write_text(SCRIPTS[name])
        (folder / "holder.py").write_text(HOLDER)
        target = ["-m", name] if module else [f"{name}.py"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(folder)]))
        r = subprocess.run(
            [*prefix, *target, *[a.replace("{dir}", str(folder)) for a in args]],
            capture_output=True, text=True, timeout=60, cwd=folder, env=env,
        )  # fmt: skip
        results.append(r)
    return results


def same(plain, quick, tmp_path):
    def norm(text: str) -> str:
        return text.replace(str(tmp_path / "plain"), "DIR").replace(str(tmp_path / "quick"), "DIR")

    assert quick.returncode == plain.returncode, (plain, quick)
    assert norm(quick.stdout) == norm(plain.stdout)
    assert norm(quick.stderr) == norm(plain.stderr)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name,args",
    [
        ("main", ("a", "--b=c")),
        ("exit_code", ("3",)),
        ("exit_code", ("0",)),
        ("exit_message", ()),
        ("uncaught", ()),
        ("keyboard_interrupt", ()),
        ("sigterm", ()),
        ("atexit_and_del", ()),
        ("computed_class", ()),
    ],
)
def test_a_script_sees_and_shows_what_it_would_under_python(tmp_path, name, args):
    plain, quick = run_both(tmp_path, name, *args)
    same(plain, quick, tmp_path)


@pytest.mark.timeout(120)
def test_the_exit_status_and_the_signal_are_pythons(tmp_path):
    statuses = {}
    for name, args in (("exit_code", ("7",)), ("exit_message", ()), ("keyboard_interrupt", ()), ("sigterm", ())):
        (tmp_path / name).mkdir()
        plain, quick = run_both(tmp_path / name, name, *args)
        statuses[name] = (plain.returncode, quick.returncode)
    assert statuses == {
        "exit_code": (7, 7),
        "exit_message": (1, 1),
        "keyboard_interrupt": (-2, -2),
        "sigterm": (-15, -15),
    }


@pytest.mark.timeout(120)
def test_a_module_runs_as_under_python_m(tmp_path):
    plain, quick = run_both(tmp_path, "main", "x", module=True)
    assert quick.returncode == plain.returncode == 0, (plain.stderr, quick.stderr)
    assert quick.stdout.replace(str(tmp_path / "quick"), "DIR") == plain.stdout.replace(str(tmp_path / "plain"), "DIR")


@pytest.mark.timeout(120)
def test_multiprocessing_spawn_finds_the_scripts_functions(tmp_path):
    plain, quick = run_both(tmp_path, "mp_spawn")
    same(plain, quick, tmp_path)
    assert quick.stdout == "[1, 4, 9]\n"


@pytest.mark.timeout(120)
def test_a_file_another_modules_global_holds_is_still_written(tmp_path):
    plain, quick = run_both(tmp_path, "module_global_file", "{dir}")
    same(plain, quick, tmp_path)
    for kind in ("plain", "quick"):
        assert (tmp_path / kind / "held.txt").read_text() == "held by another module's global\n", kind


@pytest.mark.timeout(120)
def test_a_missing_module_is_reported_as_python_m_does(tmp_path):
    plain, quick = (
        subprocess.run(
            [*prefix, "-m", "no_such_module_here"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )  # fmt: skip
        for prefix in (PLAIN, QUICK)
    )
    assert quick.returncode == plain.returncode == 1
    assert quick.stderr == plain.stderr, (plain.stderr, quick.stderr)


@pytest.mark.timeout(120)
def test_a_folder_with_a_main_runs_as_under_python(tmp_path):
    results = []
    for prefix in (PLAIN, QUICK):
        app = tmp_path / ("plain" if prefix is PLAIN else "quick") / "app"
        app.mkdir(parents=True)
        (app / "__main__.py").write_text("import sys; print(sys.argv[0].endswith('app'), sys.path[0].endswith('app'))")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        results.append(
            subprocess.run([*prefix, "app", "z"], capture_output=True, text=True, timeout=60, cwd=app.parent, env=env)
        )
    plain, quick = results
    assert (
        (quick.returncode, quick.stdout, quick.stderr)
        == (plain.returncode, plain.stdout, plain.stderr)
        == (0, "True True\n", "")
    )


@pytest.mark.timeout(120)
def test_what_native_code_left_in_cs_buffers_is_written(tmp_path):
    plain, quick = run_both(tmp_path, "c_file")
    same(plain, quick, tmp_path)
    for kind in ("plain", "quick"):
        assert (tmp_path / kind / "c_file.txt").read_text() == "written by C, never closed\n", kind
