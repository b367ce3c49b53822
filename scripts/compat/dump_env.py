"""Worker: write this worker's environment and argv as JSON to $DUMP_DIR/<RANK>.json."""

import json
import os
import sys

with open(os.path.join(os.environ["DUMP_DIR"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv[1:]}, f)
