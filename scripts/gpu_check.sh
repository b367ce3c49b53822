#!/usr/bin/env bash
# The launcher on a GPU machine, item by item: scripts/gpu_check.sh (docs/gpu.md says what each checks).
#
# Run it from a checkout after installing the project (with `pip install --no-deps -e .` where the
# machine's CUDA torch must stay). Each item prints PASS, FAIL or SKIP with a reason; the exit
# status is 1 if any item failed, else 0. Without CUDA every GPU item is a SKIP that says why, and
# the CPU items (gloo, with CUDA hidden from the workers) still run, so the script exits 0 on a
# healthy CPU machine. One GPU means world size 1 on NCCL (NCCL refuses two ranks on one device).
#
# Environment: PYTHON (default .venv/bin/python, else python3), GPU_CHECK_LOGS (a folder for the
# items' logs, default a fresh one under /tmp, kept and named at the end), GPU_CHECK_ONLY (names,
# comma-separated: run only those), GPU_CHECK_TIMEOUT (seconds per item, default 600).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$LOGS"
LIMIT=${GPU_CHECK_TIMEOUT:-600}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
LAUNCHER=("$PYTHON" -m launcher)
passed=0 failed=0 skipped=0

say() {  # STATUS NAME REASON
    printf '%-4s  %-26s %s\n' "$1" "$2" "$3"
    case $1 in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; esac
}

wanted() {  # NAME: is it selected by GPU_CHECK_ONLY?
    [ -z "${GPU_CHECK_ONLY:-}" ] || [[ ",$GPU_CHECK_ONLY," == *",$1,"* ]]
}

run() {  # NAME CMD...: run with a time limit in its own log (stdout and stderr); returns its status
    local name=$1
    shift
    timeout -k 10 "$LIMIT" "$@" >"$LOGS/$name.log" 2>&1
}

last() {  # NAME: the log's last meaningful line, for a FAIL's reason
    grep -v '^\s*$' "$LOGS/$1.log" | tail -n 1 | cut -c1-160
}

has() {  # NAME PATTERN: does the log match?
    grep -qE -- "$2" "$LOGS/$1.log"
}

# ---------------------------------------------------------------------------- what the machine has

probe=$("$PYTHON" - <<'EOF' 2>/dev/null
import torch

n = torch.cuda.device_count() if torch.cuda.is_available() else 0
if n:
    why = ""
elif torch.version.cuda is None:
    why = f"torch {torch.__version__} is a CPU build"
else:
    why = f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}: torch.cuda.is_available() is False)"
names = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(n)}))
nccl = torch.distributed.is_nccl_available() if n else False
print("\x1f".join([str(n), why, names, torch.__version__, str(int(nccl))]))
EOF
)
if [ -z "$probe" ]; then
    echo "gpu_check: $PYTHON cannot import torch; install the project first (docs/gpu.md)" >&2
    exit 2
fi
# (a separator that is not whitespace: read would merge empty fields between tabs)
IFS=$'\x1f' read -r NGPU NOGPU GPUNAMES TORCH NCCL <<<"$probe"
if [ "$NGPU" -gt 0 ] && [ "$NCCL" != 1 ]; then
    NOGPU="this torch has no NCCL"
    NGPU=0
fi
HELP=$("${LAUNCHER[@]}" --help 2>/dev/null)
echo "gpu_check: torch $TORCH, $NGPU GPU(s)${GPUNAMES:+ ($GPUNAMES)}, logs in $LOGS"
if [ "$NGPU" = 1 ]; then
    echo "gpu_check: one GPU: NCCL items run world size 1 (train_ddp, collectives, check, bench_allreduce," \
        "virtual_local_rank); nothing here tests two NCCL ranks"
fi
NP=$NGPU

# Worker scripts for the flag items: each prints one line the item checks.
cat >"$LOGS/devices.py" <<'EOF'
import os
import torch
n = torch.cuda.device_count()
uuid = str(torch.cuda.get_device_properties(0).uuid) if n else "-"
print(f"devices local_rank={os.environ['LOCAL_RANK']} local_world={os.environ['LOCAL_WORLD_SIZE']} "
      f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} count={n} uuid={uuid}", flush=True)
EOF
cat >"$LOGS/numa.py" <<'EOF'
import os
import torch
local = int(os.environ["LOCAL_RANK"])
p = torch.cuda.get_device_properties(local)
pci = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
node = max(int(open(f"/sys/bus/pci/devices/{pci}/numa_node").read()), 0)
want = set()
for part in open(f"/sys/devices/system/node/node{node}/cpulist").read().strip().split(","):
    lo, _, hi = part.partition("-")
    want.update(range(int(lo), int(hi or lo) + 1))
want &= {int(c) for c in os.environ["GPU_CHECK_ALLOWED"].split(",")}
got = os.sched_getaffinity(0)
print(f"numa local_rank={local} gpu={pci} node={node} {'ok' if got == want else 'MISMATCH'} "
      f"cpus={len(got)} expected={len(want)}", flush=True)
EOF
echo 'print("ran", flush=True)' >"$LOGS/trivial.py"
ALLOWED=$("$PYTHON" -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')

# ---------------------------------------------------------------------------- items

train_ddp() {  # NAME NPROC ENV-PREFIX... -- LAUNCHER-FLAGS...: train, SIGKILL a worker in epoch 2, resume
    local name=$1 nproc=$2
    shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    rm -rf "$LOGS/$name.ckpt"
    run "$name" env "${envs[@]}" "${LAUNCHER[@]}" --nproc_per_node "$nproc" --max_restarts 1 "$@" \
        examples/train_ddp.py --epochs 3 --checkpoint-dir "$LOGS/$name.ckpt" --crash-at-epoch 2 \
        --crash-rank $((nproc - 1))
}

check_train() {  # NAME STATUS BACKEND PRELOAD
    local name=$1 rc=$2 backend=$3 preload=$4
    if [ "$rc" != 0 ]; then
        say FAIL "$name" "exit $rc: $(last "$name")"
    elif ! has "$name" "backend $backend"; then
        say FAIL "$name" "not on $backend: $(grep -m1 'backend' "$LOGS/$name.log")"
    elif ! has "$name" "attempt 1 " || ! has "$name" "resumed (from|at step)"; then
        say FAIL "$name" "no restart that resumed (from the copy in memory or the checkpoint)"
    elif [ "$preload" = 1 ] && has "$name" "workers are spawned instead"; then
        say FAIL "$name" "the zygote gave up: $(grep -m1 'spawned instead' "$LOGS/$name.log" | cut -c1-140)"
    elif [ "$preload" = 1 ] && ! has "$name" "zygote pid [0-9]+ ready"; then
        say FAIL "$name" "no sign of the zygote in the launcher's debug log"
    else
        local how=$backend
        [ "$preload" = 1 ] && how="$backend, forked from the zygote"
        say PASS "$name" "3 epochs, a worker SIGKILLed in epoch 2, resumed ($how): $(grep -m1 -o 'resumed [^;]*' "$LOGS/$name.log" | cut -c1-90)"
    fi
}

gpu_skip() {  # NAME: SKIP without CUDA; returns 0 when the item must not run
    if [ "$NGPU" = 0 ]; then
        say SKIP "$1" "no GPU: $NOGPU"
        return 0
    fi
    return 1
}

# -- CPU items: gloo, CUDA hidden from the workers
NOCUDA=(CUDA_VISIBLE_DEVICES=)

if wanted train_ddp_gloo; then
    train_ddp train_ddp_gloo 2 "${NOCUDA[@]}" --
    check_train train_ddp_gloo $? gloo 0
fi
if wanted train_ddp_gloo_preload; then
    train_ddp train_ddp_gloo_preload 2 "${NOCUDA[@]}" -- --preload --log_level debug
    check_train train_ddp_gloo_preload $? gloo 1
fi
if wanted collectives_gloo; then
    run collectives_gloo env "${NOCUDA[@]}" "${LAUNCHER[@]}" --nproc_per_node 2 examples/collectives.py
    rc=$?
    if [ $rc = 0 ]; then say PASS collectives_gloo "every op checked on 2 ranks"; else say FAIL collectives_gloo "exit $rc: $(last collectives_gloo)"; fi
fi
if wanted check_cpu; then
    run check_cpu env "${NOCUDA[@]}" "${LAUNCHER[@]}" check --nproc_per_node 2 -- --cpu
    rc=$?
    if [ $rc = 0 ]; then say PASS check_cpu "launcher check passed on 2 ranks (gloo)"; else say FAIL check_cpu "exit $rc: $(last check_cpu)"; fi
fi
if wanted bench_allreduce_cpu; then
    run bench_allreduce_cpu env "${NOCUDA[@]}" "${LAUNCHER[@]}" bench allreduce --nproc_per_node 2 -- -b 1M -e 4M -n 5
    rc=$?
    if [ $rc = 0 ] && has bench_allreduce_cpu "Avg bus bandwidth"; then
        say PASS bench_allreduce_cpu "$(grep -m1 'Avg bus bandwidth' "$LOGS/bench_allreduce_cpu.log" | sed 's/.*# *//; s/  *:/:/') (gloo; no 5 % comparison on CPU: see docs/gpu.md)"
    else
        say FAIL bench_allreduce_cpu "exit $rc: $(last bench_allreduce_cpu)"
    fi
fi
if wanted numa_binding_no_gpu; then
    if ! grep -q -- "--numa_binding" <<<"$HELP"; then
        say SKIP numa_binding_no_gpu "--numa_binding has not landed in this checkout"
    elif [ -n "$(ls /proc/driver/nvidia/gpus 2>/dev/null)" ]; then
        say SKIP numa_binding_no_gpu "this machine has NVIDIA GPUs: see numa_binding"
    else
        run numa_binding_no_gpu "${LAUNCHER[@]}" --nproc_per_node 1 --numa_binding node "$LOGS/trivial.py"
        rc=$?
        lines=$(grep -c "numa_binding" "$LOGS/numa_binding_no_gpu.log")
        if [ $rc = 0 ] && [ "$lines" = 1 ] && has numa_binding_no_gpu "no NVIDIA GPU on this machine" && has numa_binding_no_gpu "ran"; then
            say PASS numa_binding_no_gpu "one line says there is no GPU; the job ran unbound"
        else
            say FAIL numa_binding_no_gpu "exit $rc, $lines line(s) about it: $(last numa_binding_no_gpu)"
        fi
    fi
fi

# -- GPU items: NCCL, one GPU per worker
if wanted train_ddp_nccl && ! gpu_skip train_ddp_nccl; then
    train_ddp train_ddp_nccl "$NP" --
    check_train train_ddp_nccl $? nccl 0
fi
if wanted train_ddp_nccl_preload && ! gpu_skip train_ddp_nccl_preload; then
    train_ddp train_ddp_nccl_preload "$NP" -- --preload --log_level debug
    check_train train_ddp_nccl_preload $? nccl 1
fi
if wanted collectives_nccl && ! gpu_skip collectives_nccl; then
    run collectives_nccl "${LAUNCHER[@]}" --nproc_per_node "$NP" examples/collectives.py
    rc=$?
    if [ $rc = 0 ]; then say PASS collectives_nccl "every op checked on $NP rank(s)"; else say FAIL collectives_nccl "exit $rc: $(last collectives_nccl)"; fi
fi
if wanted check_nccl && ! gpu_skip check_nccl; then
    run check_nccl "${LAUNCHER[@]}" check --nproc_per_node "$NP"
    rc=$?
    if [ $rc = 0 ]; then say PASS check_nccl "launcher check passed on $NP rank(s) (nccl)"; else say FAIL check_nccl "exit $rc: $(last check_nccl)"; fi
fi
if wanted bench_allreduce && ! gpu_skip bench_allreduce; then
    # through the launcher vs the same benchmark started by hand (scripts/bench/allreduce_overhead.py),
    # alternating, 3 runs each; mean algbw over the sizes (busbw is 0 at world size 1), medians compared
    run bench_allreduce "$PYTHON" - "$NP" <<'EOF'
import statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts/bench")
from allreduce_overhead import by_hand, with_launcher
n = int(sys.argv[1])
bench = ["-b", "64M", "-e", "512M", "-f", "2", "-w", "5", "-n", "20"]
runs = {"launcher": [], "hand": []}
with tempfile.TemporaryDirectory() as tmp:
    for rep in range(3):
        for way in (["launcher", "hand"] if rep % 2 == 0 else ["hand", "launcher"]):
            out = (with_launcher if way == "launcher" else by_hand)(n, bench, Path(tmp) / f"{way}{rep}.json")
            runs[way].append(statistics.mean(r["oop"]["algbw"] for r in out["rows"]))
a, b = statistics.median(runs["launcher"]), statistics.median(runs["hand"])
print(f"algbw launcher {a:.2f} GB/s, by hand {b:.2f} GB/s, ratio {a / b:.3f}")
sys.exit(0 if abs(a / b - 1) <= 0.05 else 1)
EOF
    rc=$?
    if [ $rc = 0 ]; then say PASS bench_allreduce "$(last bench_allreduce) (within 5 %)"; else say FAIL bench_allreduce "$(last bench_allreduce) (target: within 5 %)"; fi
fi
if wanted gpus_flag && ! gpu_skip gpus_flag; then
    run gpus_flag "${LAUNCHER[@]}" --gpus 0 "$LOGS/devices.py"
    rc=$?
    if [ $rc = 0 ] && has gpus_flag "visible=0 count=1 "; then
        say PASS gpus_flag "--gpus 0: the worker sees GPU 0 alone"
    else
        say FAIL gpus_flag "exit $rc: $(grep -m1 devices "$LOGS/gpus_flag.log" || last gpus_flag)"
    fi
fi
if wanted nproc_gpu && ! gpu_skip nproc_gpu; then
    run nproc_gpu "${LAUNCHER[@]}" --nproc_per_node gpu "$LOGS/devices.py"
    rc=$?
    got=$(grep -c "devices local_rank" "$LOGS/nproc_gpu.log")
    if [ $rc = 0 ] && [ "$got" = "$NGPU" ] && has nproc_gpu "local_world=$NGPU "; then
        say PASS nproc_gpu "--nproc_per_node gpu started $NGPU worker(s), one per GPU torch sees"
    else
        say FAIL nproc_gpu "exit $rc, $got worker(s) for $NGPU GPU(s): $(last nproc_gpu)"
    fi
fi
if wanted virtual_local_rank && ! gpu_skip virtual_local_rank; then
    run virtual_local_rank "${LAUNCHER[@]}" --nproc_per_node "$NP" --virtual_local_rank "$LOGS/devices.py"
    rc=$?
    zero=$(grep -c "local_rank=0 .*count=1 " "$LOGS/virtual_local_rank.log")
    uuids=$(grep -o "uuid=[^ ]*" "$LOGS/virtual_local_rank.log" | sort -u | wc -l)
    if [ $rc = 0 ] && [ "$zero" = "$NP" ] && [ "$uuids" = "$NP" ]; then
        say PASS virtual_local_rank "$NP worker(s), each LOCAL_RANK=0 on its own GPU"
    else
        say FAIL virtual_local_rank "exit $rc, $zero of $NP with LOCAL_RANK=0 and one GPU, $uuids distinct GPU(s)"
    fi
fi
if wanted numa_binding; then
    if ! grep -q -- "--numa_binding" <<<"$HELP"; then
        say SKIP numa_binding "--numa_binding has not landed in this checkout"
    elif ! gpu_skip numa_binding; then
        run numa_binding env GPU_CHECK_ALLOWED="$ALLOWED" "${LAUNCHER[@]}" --nproc_per_node "$NP" --numa_binding node "$LOGS/numa.py"
        rc=$?
        ok=$(grep -c "numa local_rank=.* ok " "$LOGS/numa_binding.log")
        if [ $rc = 0 ] && [ "$ok" = "$NP" ]; then
            say PASS numa_binding "node: each of $NP worker(s) on the CPUs of its GPU's NUMA node ($(grep -m1 -o 'node=[0-9]* ok cpus=[0-9]*' "$LOGS/numa_binding.log"))"
        else
            say FAIL numa_binding "exit $rc, $ok of $NP bound as torch would: $(grep -m1 -E 'MISMATCH|numa_binding' "$LOGS/numa_binding.log" || last numa_binding)"
        fi
    fi
fi
if wanted in_place_nccl && ! gpu_skip in_place_nccl; then
    # --recovery in-place on NCCL at world size 1 (scripts/gpu_in_place.py: regroup, launcher, blocked)
    run in_place_nccl "$PYTHON" scripts/gpu_in_place.py
    rc=$?
    if [ $rc = 0 ]; then
        say PASS in_place_nccl "abort from another thread, a new group in the same process, a SIGKILLed rank replaced alone"
    else
        say FAIL in_place_nccl "exit $rc: $(grep -m1 FAIL "$LOGS/in_place_nccl.log" || last in_place_nccl)"
    fi
fi
if wanted nvml_health; then
    if ! grep -q -- "--health_check" <<<"$HELP"; then
        say SKIP nvml_health "--health_check has not landed in this checkout (issue 22)"
    elif ! gpu_skip nvml_health; then
        if ! "$PYTHON" -c "import pynvml" 2>/dev/null; then
            say SKIP nvml_health "nvidia-ml-py is not installed (pip install -e '.[gpu]' from the checkout)"
        else
            # the gate's built-in NVML checks run with any --health_check; `true` adds nothing of its own
            run nvml_health "${LAUNCHER[@]}" --nproc_per_node "$NP" --health_check true "$LOGS/trivial.py"
            rc=$?
            if [ $rc = 0 ] && has nvml_health "^(\[rank0\]: )?ran"; then
                say PASS nvml_health "the built-in NVML checks (GPUs visible, no ECC or retired-page trouble, memory freed) let the node in"
            else
                say FAIL nvml_health "exit $rc: $(last nvml_health)"
            fi
        fi
    fi
fi

echo "gpu_check: $passed passed, $failed failed, $skipped skipped; logs in $LOGS"
[ "$failed" = 0 ]
