"""A module that starts a thread when imported: unsafe to preload in a process that forks."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="threadmod-sleeper", daemon=True).start()
