"""`python -m launcher.agent.zygote FD AGENT MODULE…`: the preloaded interpreter (see `server`)."""

import sys

from ..quick_exit import exit_worker
from .server import become_worker, main, run_worker

_job = main(sys.argv)  # returns only in a forked worker
become_worker(_job)
exit_worker(lambda: run_worker(_job))
