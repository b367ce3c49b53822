"""What a spawned Python worker runs as its main file: `python -u …/launcher/agent/worker_exit.py SCRIPT ARGS…`.

The work is `quick_exit`'s (the script as `__main__`, then python's exit less finalisation; docs/preload.md,
"A worker's exit"). This file stays a few lines because python compiles a main file from source on every
run, where an imported module is read from its bytecode: each of eight workers paid ~5 ms for it.
"""

import sys

# `quick_exit` (standard library only, so any interpreter runs it without the launcher) is imported from
# this file's folder, which python puts first on sys.path until the script's takes its place; under -P or
# PYTHONSAFEPATH it does not, and the folder is put there for the import alone. It is then dropped from
# sys.modules, so that a module of the user's by that name is theirs.
safe_path = getattr(sys.flags, "safe_path", False)
if safe_path:
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quick_exit  # noqa: E402

if safe_path:
    del sys.path[0]
del sys.modules["quick_exit"], safe_path
quick_exit.main(sys.argv)
