"""A module slow to import on purpose (1.5 s, past the agent's 1 s before it says it waits for a
preload): the stand-in for torch's import on a busy host."""

import time

time.sleep(1.5)
