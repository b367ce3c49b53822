"""Rank $FAIL_RANK raises RuntimeError inside a `launcher.record` main after $FAIL_AFTER s;
the others sleep $SLEEP s."""

import os
import time

from launcher import record


@record
def main():
    if os.environ["RANK"] == os.environ.get("FAIL_RANK"):
        time.sleep(float(os.environ.get("FAIL_AFTER", "0.5")))
        raise RuntimeError(f"loss is NaN at step 7 on rank {os.environ['RANK']}")
    time.sleep(float(os.environ.get("SLEEP", "30")))


if __name__ == "__main__":
    main()
