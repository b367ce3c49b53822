"""all_reduce benchmark in the manner of nccl-tests' all_reduce_perf; runs in the workers.

    python -m launcher bench allreduce --nproc_per_node 2 -- -b 1K -e 16M -f 4
    python -m launcher --nproc_per_node 2 -m launcher.worker.allreduce -b 1K -e 16M -f 4   # the same

Sizes go from -b to -e (bytes; 8, 1K, 64M, 1G: K/M/G are powers of 1024), times -f each step
(or plus -i when -f is 1); with neither -f nor -i, times 2 (nccl-tests would add 1M, one row for -b 1K
-e 1M). For each size and each placement (out-of-place: separate send and
receive buffers; in-place: one buffer) it runs -w untimed iterations, a barrier, then -n timed
iterations back to back; time = wall time / n, averaged over the ranks (nccl-tests' `-a 1`).
  algbw = size / time   (GB/s, 1 GB = 1e9 bytes)
  busbw = algbw * 2(n-1)/n   (n ranks: each moves 2(n-1)/n of the buffer; comparable to a link's peak)
With -c 1 (the default) every size and placement is also checked once, apart from the timing: rank r
fills element i with r + 1 + (i mod 3), and every element of the sum must be n(n+1)/2 + n(i mod 3);
#wrong counts the wrong elements over all ranks. The last lines are nccl-tests' "Avg bus bandwidth"
(the mean busbw over every row and both placements) and the check's verdict; the exit status is 1 on
every rank when any element was wrong. Test hook: LAUNCHER_ALLREDUCE_CORRUPT_RANK=R makes rank R add 1 to
the last element of its check input, so the sums come out wrong.

gloo on CPU; NCCL on CUDA, one GPU per worker (cuda:LOCAL_RANK). Rank 0 prints. -J FILE writes the
rows as JSON too. Importing this module does not import torch (the launcher reads its --help).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

DTYPES = {
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "float64": "float64",
    "int32": "int32",
    "int": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
CORRUPT_VAR = "LAUNCHER_ALLREDUCE_CORRUPT_RANK"  # test hook: that rank's check input is off by one
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """'8' -> 8, '1K' -> 1024, '64M' -> 67108864 (nccl-tests' units; a trailing B is allowed)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in UNITS and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 8, 1K, 64M)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return int(value)


def human(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= UNITS[unit] and nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]}{unit}"
    return str(nbytes)


def sizes(minbytes: int, maxbytes: int, factor: float, step: int) -> list[int]:
    out, s = [], max(minbytes, 1)
    while s <= maxbytes:
        out.append(s)
        nxt = int(s * factor) if factor > 1 else s + step
        if nxt <= s:
            break
        s = nxt
    return out


def plan(args: argparse.Namespace) -> list[int]:
    """The sizes to run: -f and -i as in nccl-tests; with only -b/-e, a factor of 2 (not one row)."""
    factor = args.stepfactor if args.stepfactor is not None else (1 if args.stepbytes is not None else 2)
    return sizes(args.minbytes, args.maxbytes, factor, args.stepbytes or parse_size("1M"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        usage="python -m launcher bench allreduce [launcher flags] [-- options]",
        description="all_reduce bandwidth, nccl-tests style (rank 0 prints the table).",
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"), help="smallest size (default 32M)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"), help="largest size (default 32M)")
    p.add_argument(
        "-f",
        "--stepfactor",
        type=float,
        default=None,
        help="multiply the size by this each step (default: factor 2 unless -i is given)",
    )
    p.add_argument(
        "-i", "--stepbytes", type=parse_size, default=None, help="add this each step when -f is 1 (default 1M)"
    )
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-d", "--datatype", default="float32", choices=sorted(DTYPES), help="element type (default float32)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1), help="check the result (default 1)")
    p.add_argument("--backend", default=None, choices=("gloo", "nccl"), help="default: nccl on CUDA, gloo on CPU")
    p.add_argument("--cpu", action="store_true", help="use CPU tensors (gloo) even when CUDA is there")
    p.add_argument("-J", "--json", metavar="FILE", help="rank 0 writes the rows here as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.iters < 1 or args.warmup_iters < 0:
        sys.exit("allreduce: -n must be >= 1 and -w >= 0")
    if "RANK" not in os.environ:
        sys.exit("allreduce: run me under the launcher: python -m launcher bench allreduce --nproc_per_node 2")
    import torch  # only here: the agent imports this module for --help and must stay light
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dtype = getattr(torch, DTYPES[args.datatype])
    if torch.cuda.is_available() and not args.cpu:  # NCCL: one GPU per worker
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group(args.backend or "nccl", init_method="env://", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(args.backend or "gloo", init_method="env://")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    elem = torch.empty((), dtype=dtype).element_size()
    factor = 2 * (world - 1) / world
    corrupt_rank = int(os.environ.get(CORRUPT_VAR, "-1"))

    def pattern(count: int, r: int):
        return (torch.arange(count, device=device) % 3 + (r + 1)).to(dtype)

    def check(count: int, in_place: bool) -> int:
        """Run the op once on the check pattern; return this rank's wrong elements."""
        send = pattern(count, rank)
        if rank == corrupt_rank:
            send[-1] += 1  # the test hook: this rank's contribution is off by one in its last element
        recv = send if in_place else torch.full_like(send, -1)
        dist.all_reduce(send if in_place else recv.copy_(send))
        want = (torch.arange(count, device=device) % 3 * world + world * (world + 1) // 2).double()
        got = recv.double()
        if dtype.is_floating_point and want.max() > 2 / torch.finfo(dtype).eps:  # past exact integers
            wrong = ~torch.isclose(got, want, rtol=torch.finfo(dtype).eps * world, atol=0)
        else:
            wrong = got != want
        if not in_place and rank != corrupt_rank:  # the send buffer must come back untouched
            wrong |= send != pattern(count, rank)
        return int(wrong.sum())

    def timed(count: int, in_place: bool) -> float:
        # torch's all_reduce works in place: out-of-place is a copy into the receive buffer, then
        # the all_reduce there (what nccl-tests' separate sendbuff/recvbuff amount to), the copy timed
        send = pattern(count, rank)
        recv = send if in_place else torch.empty_like(send)
        op = (lambda: dist.all_reduce(send)) if in_place else (lambda: dist.all_reduce(recv.copy_(send)))
        for _ in range(args.warmup_iters):
            op()
        sync()
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            op()
        sync()
        return (time.perf_counter() - t0) / args.iters

    rows, total_wrong = [], 0
    if rank == 0:
        print(
            f"# all_reduce sum: {world} ranks, backend {dist.get_backend()}, device {device.type}, "
            f"{args.datatype}, warm-up {args.warmup_iters}, iters {args.iters}, check {args.check}"
        )
        print(f"# {'':>10} {'':>12} {'':>8}  {'out-of-place':^34}  {'in-place':^34}")
        print(
            f"# {'size':>10} {'count':>12} {'type':>8}  {'time':>8} {'algbw':>8} {'busbw':>8} {'#wrong':>7}"
            f"  {'time':>8} {'algbw':>8} {'busbw':>8} {'#wrong':>7}"
        )
        print(
            f"# {'(B)':>10} {'(elements)':>12} {'':>8}  {'(us)':>8} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}"
            f"  {'(us)':>8} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
            flush=True,
        )
    for size in plan(args):
        count = size // elem
        if count == 0:
            continue
        nbytes = count * elem
        row = {"size": nbytes, "count": count, "type": args.datatype}
        stats = []
        for place in ("oop", "ip"):
            wrong = check(count, place == "ip") if args.check else -1
            sec = timed(count, place == "ip")
            stats += [sec, float(wrong)]
        agg = torch.tensor(stats, dtype=torch.float64, device=device)
        dist.all_reduce(agg)  # time: the mean over ranks; #wrong: the total
        for j, place in enumerate(("oop", "ip")):
            sec = agg[2 * j].item() / world
            algbw = nbytes / 1e9 / sec
            wrong = int(agg[2 * j + 1].item()) if args.check else None
            total_wrong += wrong or 0
            row[place] = {"time_us": sec * 1e6, "algbw": algbw, "busbw": algbw * factor, "wrong": wrong}
        rows.append(row)
        if rank == 0:
            cells = "".join(
                f"  {row[p]['time_us']:8.1f} {row[p]['algbw']:8.3f} {row[p]['busbw']:8.3f} "
                f"{'N/A' if row[p]['wrong'] is None else row[p]['wrong']:>7}"
                for p in ("oop", "ip")
            )
            print(f"  {nbytes:>10} {count:>12} {args.datatype:>8}{cells}", flush=True)
    avg = sum(r[p]["busbw"] for r in rows for p in ("oop", "ip")) / max(2 * len(rows), 1)
    if rank == 0:
        print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {avg:.4f} GB/s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "world": world,
                        "backend": dist.get_backend(),
                        "device": device.type,
                        "rows": rows,
                        "avg_busbw": avg,
                        "wrong": total_wrong,
                    },
                    f,
                    indent=1,
                )
    dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while a peer still talks
    dist.destroy_process_group()
    return 1 if total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
