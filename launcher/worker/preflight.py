"""Pre-flight check of a job's ranks and fabric, run in the workers before a big job.

    python -m launcher check --nnodes 4 --node_rank $NODE --master_addr node0 --nproc_per_node 8
    python -m launcher --nproc_per_node 8 -m launcher.worker.preflight      # the same, spelled out

Started like any job, on every node. Each rank reports host, device, backend, torch, Python, CUDA and
NCCL versions and GPU name; then, over the job's process group (NCCL on CUDA, gloo on CPU):
- all_reduce: rank r writes a pattern into row r of a [world, 1024] zero tensor; after the sum every
  rank must get every row back. A row wrong on most ranks blames its sender (its data or its link
  out); a row wrong on only some ranks blames those receivers. all_gather: the same, gathered.
- versions: a rank whose torch/Python/CUDA/NCCL differ from the most common set is flagged; so are
  two ranks on one GPU.
- bandwidth: all_reduce over all ranks at --sizes gives the job's busbw, reported, not judged: the
  ranks of a collective finish together, so it cannot single out a slow one. For that, ranks pair up
  in up to 3 rounds (round k pairs r with (k - r) mod world; a round's pairs run at once, each in its
  own 2-rank group), each pair times all_reduce at --sizes (best of --iters), and a rank's figure is
  its BEST pair's busbw: a slow rank or node is slow with every partner, a sound one has a sound
  partner. Ranks under --slow-factor x the median fail, and a host whose ranks all do is named. With
  2 ranks there is one pair, which cannot say which end is slow: not judged. On one host with gloo
  the pairs share cores and loopback, so the figures agree up to scheduling noise, which the best of
  --iters and the 0.5x margin absorb; the slow-rank hook shows the probe at work.
Rank 0 says on stderr what it checks as each step begins (one line each: importing torch, joining,
the correctness checks, the bandwidth probes), then prints one row per rank and a verdict. When
anything is wrong every rank exits 1, the ranks to blame first (so the launcher's summary names one).

Test hooks: LAUNCHER_PREFLIGHT_CORRUPT_RANK=R makes rank R add 1 to its all_reduce input;
LAUNCHER_PREFLIGHT_SLOW_RANK=R makes rank R sleep 100 ms before every probe all_reduce
(5 times a loaded 2-core host's slowest 1M all_reduce: no noise makes it look healthy).
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import socket
import statistics
import sys
import time
from datetime import timedelta

from .allreduce import human, parse_size  # neither imports torch

CORRUPT_VAR, SLOW_VAR = "LAUNCHER_PREFLIGHT_CORRUPT_RANK", "LAUNCHER_PREFLIGHT_SLOW_RANK"
N = 1024  # elements per rank in the correctness checks


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        usage="python -m launcher check [launcher flags] [-- options]",
        description="Check every rank and the fabric before a big job.",
    )
    p.add_argument(
        "--sizes",
        type=lambda text: [parse_size(t) for t in text.split(",")],
        help="all_reduce sizes of the bandwidth probe (default 256K,4M on CPU, 4M,64M on CUDA)",
    )
    p.add_argument("--iters", type=int, default=5, help="timed all_reduces per size, the best one kept (default 5)")
    p.add_argument("--slow-factor", type=float, default=0.5, help="flag ranks under this x the median (0: off)")
    p.add_argument("--timeout", type=float, default=120, help="seconds before a stuck collective fails (default 120)")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and gloo even when CUDA is there")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if "RANK" not in os.environ:
        sys.exit("preflight: run me under the launcher: python -m launcher check --nproc_per_node N")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def say(text: str) -> None:
        """Rank 0's note on what starts now: every step can take seconds, none of them silently."""
        if rank == 0:
            print(f"check: {text}", file=sys.stderr, flush=True)

    say(f"{world} ranks: importing torch, then joining the process group")
    import torch  # only here: the agent imports this module for --help and must stay light
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = timedelta(seconds=args.timeout)
    info = {
        "rank": rank,
        "host": socket.gethostname(),
        "local": local_rank,
        "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0],
        "cuda": "-",
        "nccl": "-",
        "gpu": "-",
    }
    if torch.cuda.is_available() and not args.cpu:  # NCCL: one GPU per worker
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # no device_id: it would make new_group split the NCCL communicator, a collective that
        # every rank must join for every group; unbound, a pair's group involves the pair alone
        dist.init_process_group("nccl", init_method="env://", timeout=timeout)
        props = torch.cuda.get_device_properties(device)
        info.update(
            cuda=torch.version.cuda,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            gpu=props.name,
            uuid=str(getattr(props, "uuid", local_rank)),
        )
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    info.update(device=str(device), backend=dist.get_backend())
    sizes = args.sizes or ([4 << 20, 64 << 20] if device.type == "cuda" else [256 << 10, 4 << 20])
    at = ", ".join(human(s) for s in sizes)
    say(f"joined ({info['backend']} on {device.type}); all_reduce and all_gather of each rank's own data")

    def pattern(r):
        return torch.arange(N, dtype=torch.float32, device=device) % 251 + 1000 * (r + 1)

    # Correctness: which rows (senders) arrived wrong here, counted over the ranks.
    t = torch.zeros(world, N, device=device)
    t[rank] = pattern(rank)
    if os.environ.get(CORRUPT_VAR) == str(rank):
        t[rank, -1] += 1
    dist.all_reduce(t)
    gathered = [torch.empty(N, device=device) for _ in range(world)]
    dist.all_gather(gathered, pattern(rank))
    seen = torch.tensor(
        [
            [float(not torch.equal(t[r], pattern(r))) for r in range(world)],
            [float(not torch.equal(gathered[r], pattern(r))) for r in range(world)],
        ],
        device=device,
    )
    info["seen"] = seen.tolist()
    dist.all_reduce(seen)  # seen[op][r]: how many ranks got row r wrong

    def probe(group, group_size):
        """all_reduce busbw in `group`: at each size (best of --iters), and over all sizes together."""
        factor = 2 * (group_size - 1) / group_size
        total_b = total_t = 0.0
        each = []
        for size in sizes:
            buf = torch.ones(max(size // 4, 1), device=device)
            dist.all_reduce(buf, group=group)  # warm-up (and connection set-up)
            best = float("inf")
            for _ in range(args.iters):
                sync()
                t0 = time.perf_counter()
                if os.environ.get(SLOW_VAR) == str(rank):
                    time.sleep(0.1)
                dist.all_reduce(buf, group=group)
                sync()
                best = min(best, time.perf_counter() - t0)
            total_b, total_t = total_b + buf.numel() * 4, total_t + best
            each.append(buf.numel() * 4 / 1e9 / best * factor)
        return total_b / 1e9 / total_t * factor, each

    say(f"bandwidth: all_reduce over {world} ranks at {at} (best of {args.iters} each)")
    info["job_busbw"] = probe(None, world)[1]
    pair_bw, rounds = [], min(3, world)
    for k in range(1, rounds + 1):
        say(f"pair probe {k} of {rounds}: the ranks in pairs, all_reduce at {at}")
        dist.barrier()  # the pairs of one round run together
        partner = (k - rank) % world
        # every rank makes one group a round, alone when it sits out: torch names a locally made
        # group after its ranks and the number of groups made so far, which must agree in a pair
        group = dist.new_group(sorted({rank, partner}), timeout=timeout, use_local_synchronization=True)
        if partner != rank:
            pair_bw.append(probe(group, 2)[0])
    info["pair"] = max(pair_bw, default=0.0)

    everyone = [None] * world
    dist.all_gather_object(everyone, info)
    verdict = torch.zeros(world + 1, device=device)  # [any problem, then 1 for each rank to blame]
    if rank == 0:
        failures = judge(everyone, seen.tolist(), world, args.slow_factor)
        print_table(everyone, world, sizes, failures)
        verdict[0] = float(bool(failures))
        for r, _ in failures:
            verdict[1 + r] = 1.0
    dist.broadcast(verdict, src=0)  # rank 0 judged: every rank exits with the verdict
    dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
    dist.destroy_process_group()
    if verdict[0] and not verdict[1 + rank]:
        time.sleep(1)  # the ranks to blame exit first, so the launcher's summary names one of them
    return 1 if verdict[0] else 0


def judge(everyone, seen, world, slow_factor):
    """Problems as (rank, text); sets each rank's all_reduce, all_gather and status cells too."""
    out, versions = [], collections.Counter((i["torch"], i["python"], i["cuda"], i["nccl"]) for i in everyone)
    common = versions.most_common(1)[0][0]
    median = statistics.median(i["pair"] for i in everyone)
    gpus = collections.Counter((i["host"], i.get("uuid")) for i in everyone if "uuid" in i)
    for i in everyone:
        r, bad = i["rank"], []
        for op, name in enumerate(("all_reduce", "all_gather")):
            i[name] = "ok"
            if seen[op][r] > world // 2:
                bad.append(f"{name}: its data arrived wrong on {int(seen[op][r])}/{world} ranks")
                i[name] = "WRONG (sent)"
            elif any(i["seen"][op][s] and seen[op][s] <= world // 2 for s in range(world)):
                bad.append(f"{name}: it received wrong data")
                i[name] = "WRONG (got)"
        if (i["torch"], i["python"], i["cuda"], i["nccl"]) != common:
            bad.append("versions differ from most ranks'")
        if gpus.get((i["host"], i.get("uuid")), 0) > 1:
            bad.append("shares its GPU with another rank")
        if world > 2 and slow_factor and i["pair"] < slow_factor * median:
            bad.append(f"slow: {i['pair']:.3f} GB/s, under {slow_factor}x the median {median:.3f}")
        i["status"] = "ok" if not bad else "FAIL"
        out += [(r, f"rank {r} ({i['host']}): {b}") for b in bad]
    hosts, slow = collections.defaultdict(list), {r for r, text in out if ": slow:" in text}
    for i in everyone:
        hosts[i["host"]].append(i["rank"])
    for host, ranks in hosts.items():
        if len(hosts) > 1 and slow.issuperset(ranks):
            out.append((ranks[0], f"host {host}: all its ranks are slow ({len(ranks)})"))
    return out


def print_table(everyone, world, sizes, failures):
    cols = [
        "rank",
        "host",
        "local",
        "device",
        "backend",
        "torch",
        "python",
        "cuda",
        "nccl",
        "gpu",
        "all_reduce",
        "all_gather",
    ]
    rows = [[str(i[c]) for c in cols] + [f"{i['pair']:.3f}", i["status"]] for i in everyone]
    head = cols + ["pair GB/s", "status"]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip())
    bw = [statistics.median(i["job_busbw"][j] for i in everyone) for j in range(len(sizes))]
    print(
        f"all_reduce over {world} ranks, busbw (median of ranks): "
        + ", ".join(f"{human(s)} {b:.3f} GB/s" for s, b in zip(sizes, bw))
    )
    if world == 2:
        print("pair probe: 2 ranks make one pair, so it cannot tell which is slow (not judged)")
    if failures:
        print(f"FAIL: {len({r for r, _ in failures})} of {world} ranks have problems:")
        print("\n".join(f"  {text}" for _, text in failures))
    else:
        print(
            f"PASS: {world} ranks on {len({i['host'] for i in everyone})} host(s): versions agree, "
            "all_reduce and all_gather right, no slow rank"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
