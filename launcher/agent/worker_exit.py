"""What a spawned Python worker runs as its main file: `python -u …/launcher/agent/worker_exit.py SCRIPT ARGS…`.

The work is `quick_exit`'s (the script as `__main__`, then python's exit less finalisation; docs/preload.md,
"A worker's exit"). This file stays a few lines because python compiles a main file from source on every
run, where an imported module is read from its bytecode: each of eight workers paid ~5 ms for it.
"""

import sys

# sys.path[0] is this file's folder until the script's takes its place: `quick_exit` (standard library
# only, so any interpreter runs it without the launcher) is imported from here, then dropped from
# sys.modules, so that a module of the user's by that name is theirs.
import quick_exit

del sys.modules["quick_exit"]
quick_exit.main(sys.argv)
