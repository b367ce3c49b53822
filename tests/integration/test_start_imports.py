"""What a plain launch line loads before its first worker starts, and what a spawned worker's main file
loads before the script runs: start-up time (scripts/bench/RESULTS.md, "Issue 43, round 3")."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from support.paths import ROOT
from support.ports import free_port

from launcher import config as cfg

# Modules a plain `launcher --nproc_per_node N script.py` does without: each is loaded where a flag asks.
NOT_ON_A_PLAIN_LAUNCH = (
    "click",  # help, subcommands and every other line (cli/start.py)
    "typing",  # annotations only: TYPE_CHECKING
    "uuid",  # the local run id (config._uuid4); the file timer's name, only with TORCHELASTIC_ENABLE_FILE_TIMER
    "platform",  # uuid's
    "launcher.agent.recovery",  # --recovery in-place
    "launcher.rendezvous.etcd.settings",  # --rdzv_backend etcd
    "launcher.agent.zygote.messages",  # --preload
)


def loaded(argv: list[str]) -> set[str]:
    """The modules loaded once `argv` ran, as its last line of output lists them."""
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.splitlines()[-1].split())


def test_a_plain_launch_loads_none_of_what_only_a_flag_needs():
    code = (
        "import sys; import launcher.cli.start, launcher.cli.run, launcher.rendezvous.local; "
        f"launcher.config.from_flags(nproc_per_node='2', training_script={__file__!r}); print(' '.join(sys.modules))"
    )
    modules = loaded([sys.executable, "-c", code])
    assert "launcher.agent.supervisor" in modules  # (the agent's machinery is there)
    assert modules.isdisjoint(NOT_ON_A_PLAIN_LAUNCH), sorted(modules.intersection(NOT_ON_A_PLAIN_LAUNCH))


def test_a_spawned_workers_main_file_loads_next_to_nothing(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys; print(' '.join(sys.modules))\n")
    bare = loaded([sys.executable, "-u", str(script)])
    quick = loaded([sys.executable, "-u", cfg.QUICK_EXIT, str(script)])
    # built-in modules (and __future__'s few lines): no threading, signal, ctypes, runpy, nor `quick_exit` itself
    assert quick - bare <= {"__future__", "atexit", "gc"}


def test_a_spawned_worker_runs_under_safe_path(tmp_path):
    # -P / PYTHONSAFEPATH: python leaves the main file's folder off sys.path, where quick_exit is found
    script = tmp_path / "script.py"
    script.write_text("import sys; print(sys.argv[1:])\n")
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    out = subprocess.run(
        [sys.executable, "-u", cfg.QUICK_EXIT, str(script), "a"], env=env, capture_output=True, text=True
    )
    assert (out.returncode, out.stdout) == (0, "['a']\n"), out.stderr


def test_the_local_run_id_is_a_uuid4():
    ids = {cfg._uuid4() for _ in range(200)}
    assert len(ids) == 200
    for text in ids:
        u = uuid.UUID(text)
        assert (str(u), u.version, u.variant) == (text, 4, uuid.RFC_4122)


def test_c10d_agent_never_imports_torch():
    code = f"""
import sys
from launcher.config import from_flags
from launcher.rendezvous import create_rendezvous, Cause
cfg = from_flags(training_script="x", no_python=True, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:{free_port()}",
                 rdzv_id="imports", rdzv_conf="last_call_timeout=0.1")
r = create_rendezvous(cfg.rdzv_backend, cfg.rendezvous, cfg.job)
rnd = r.next_round(Cause.START)
hosted = r.server is not None
r.shutdown(True)
print(rnd.world_size, hosted, "torch" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.split() == ["1", "True", "False"], r.stderr
