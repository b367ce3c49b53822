"""Print rank and arguments on one line."""

import os
import sys

print(f"rank={os.environ['RANK']} args={sys.argv[1:]}", flush=True)
