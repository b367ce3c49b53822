"""Worker: every op of torch's TCPStore client, against the store the agent serves (MASTER_ADDR:PORT).

Ops this torch lacks are skipped; the ones run are printed, so the matrix says what was covered.
"""

import os
from datetime import timedelta

import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, timedelta(seconds=30))
p = f"compat/{os.environ['TORCHELASTIC_RESTART_COUNT']}/"
ran = ["set", "get", "add", "compare_set", "check", "wait", "delete_key", "num_keys", "set_timeout"]
store.set(p + f"k{rank}", f"v{rank}")
assert store.add(p + "count", 1) >= 1
store.wait([p + f"k{r}" for r in range(world)])
assert store.get(p + f"k{(rank + 1) % world}") == f"v{(rank + 1) % world}".encode()
assert store.check([p + "k0"])
assert store.num_keys() >= world
store.set_timeout(timedelta(seconds=30))
if rank == 0:
    assert store.compare_set(p + "cas", "", "first") == b"first"
    assert store.compare_set(p + "cas", "first", "second") == b"second"
    assert store.compare_set(p + "cas", "nope", "third") == b"second"
    store.set(p + "gone", "x")
    assert store.delete_key(p + "gone") and not store.check([p + "gone"])
if hasattr(store, "append"):
    store.append(p + "log", f"<{rank}>")
    ran.append("append")
if hasattr(store, "multi_set"):
    store.multi_set([p + f"m{rank}a", p + f"m{rank}b"], ["1", "2"])
    assert store.multi_get([p + f"m{rank}a", p + f"m{rank}b"]) == [b"1", b"2"]
    ran += ["multi_set", "multi_get"]
if hasattr(store, "queue_push"):
    store.queue_push(p + "q", f"{rank}")
    ran += ["queue_push"]
store.set(p + f"done{rank}", "1")
store.wait([p + f"done{r}" for r in range(world)])  # every rank's writes are in before anyone reads them back
if hasattr(store, "append"):
    assert len(store.get(p + "log")) == 3 * world
if hasattr(store, "queue_push"):
    popped = {store.queue_pop(p + "q").decode() for _ in range(world)} if rank == 0 else set()
    assert rank != 0 or popped == {str(r) for r in range(world)}, popped
    ran += ["queue_pop", "queue_len"] if hasattr(store, "queue_len") else ["queue_pop"]
if hasattr(store, "list_keys"):
    assert any(k.endswith("count") for k in store.list_keys())
    ran.append("list_keys")
print(f"store ok rank={rank} ops={','.join(ran)}", flush=True)
