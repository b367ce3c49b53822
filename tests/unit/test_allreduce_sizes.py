"""`bench allreduce`'s sizes, as nccl-tests reads them: -b/-e/-f/-i and the size suffixes."""

from __future__ import annotations


def test_sizes_parse_like_nccl_tests():
    from launcher.worker.allreduce import parse_size, sizes

    assert [parse_size(s) for s in ("8", "1K", "64M", "1G", "2kb")] == [8, 1024, 64 << 20, 1 << 30, 2048]
    assert sizes(1024, 16 << 20, 4, 0) == [1024 * 4**i for i in range(8)]  # 1K .. 16M
    assert sizes(8, 8, 2, 0) == [8]
    assert sizes(1 << 20, 3 << 20, 1, 1 << 20) == [1 << 20, 2 << 20, 3 << 20]  # -f 1: plus -i


def test_bench_allreduce_explicit_steps_are_nccl_tests_steps():
    from launcher.worker.allreduce import parser, plan

    def planned(*argv):
        return plan(parser().parse_args(list(argv)))

    assert planned("-b", "1K", "-e", "1M") == [2**k for k in range(10, 21)]
    assert planned("-b", "1K", "-e", "3K", "-i", "1K") == [1024, 2048, 3072]  # -i alone: add it each step
    assert planned("-b", "1K", "-e", "8K", "-f", "4") == [1024, 4096]
    assert planned("-b", "1K", "-e", "3M", "-f", "1") == [1024, 1024 + 2**20, 1024 + 2 * 2**20]  # nccl-tests' -i 1M
    assert planned() == [32 * 2**20]
    assert "factor 2" in parser().format_help()
