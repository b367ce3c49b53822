"""Run as `-m pkg.hello`: prints rank and arguments."""

import os
import sys

print(f"module rank={os.environ['RANK']} args={sys.argv[1:]}", flush=True)
