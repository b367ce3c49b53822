"""all_reduce bandwidth like nccl-tests (out-of-place and in-place, checked; busbw = algbw*2(n-1)/n).

    python -m launcher --nproc_per_node 2 examples/allreduce_bench.py -b 1K -e 16M -f 4
    torchrun --nproc_per_node 2 examples/allreduce_bench.py -b 1K -e 16M -f 4      # any launcher
Same as `python -m launcher bench allreduce --nproc_per_node 2 -- -b 1K -e 16M -f 4`; code and
options (-h): launcher/worker/allreduce.py. gloo on CPU, NCCL on one GPU per worker.
"""

import sys

from launcher.worker.allreduce import main

sys.exit(main())
