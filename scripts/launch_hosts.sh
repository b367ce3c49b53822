#!/usr/bin/env bash
# Start the launcher on every host of a hostfile over ssh, stream each host's output with a [host]
# prefix, and on Ctrl-C / SIGTERM stop exactly what this run started.
#
#   scripts/launch_hosts.sh -f hosts.txt [-e VAR]... [-p PORT] -- [LAUNCHER FLAGS] SCRIPT [ARGS...]
#   scripts/launch_hosts.sh -f hosts.txt -e WANDB_API_KEY -- --nproc_per_node 8 train.py --lr 0.1
#
# hostfile: one host per line ([user@]host), optional `slots=N` (that host's --nproc_per_node);
# blank lines and # comments are skipped. Host i (from 0) runs
#   cd DIR && exec PYTHON -m launcher [--nproc_per_node SLOTS] --nnodes N --node_rank i \
#       --master_addr FIRST_HOST --master_port PORT LAUNCHER FLAGS SCRIPT ARGS
# so do not pass --nnodes/--node_rank/--master_addr/--master_port yourself. Hosts with different
# slots need --rdzv c10d (the static rendezvous assumes one --nproc_per_node everywhere).
#
# Options:
#   -f, --hostfile FILE   the hosts (required)
#   -e, --env NAME        also forward this variable (repeatable, or NAME1,NAME2); every PET_*,
#                         NCCL_*, GLOO_* and TORCH_* variable set here is always forwarded
#   -p, --master_port P   rendezvous port on the first host (default 29500)
#   --rdzv static|c10d    static (default): --node_rank i --master_addr FIRST_HOST as above;
#                         c10d: --rdzv_backend c10d --rdzv_endpoint FIRST_HOST:PORT, ranks by the
#                         rendezvous (hosts may have different slots)
#   -C, --chdir DIR       remote working directory (default: this one, $PWD)
#   --python PY           remote interpreter with the launcher installed (default: $PYTHON or python3)
#   --grace SEC           after a stop request, how long the launchers get before SIGKILL (default 45;
#                         the launcher itself gives its workers --shutdown_timeout, 30 s by default)
# Environment: SSH, the ssh command and its options (default "ssh"), e.g.
#   SSH="ssh -p 2222 -i ~/.ssh/cluster -o StrictHostKeyChecking=no" scripts/launch_hosts.sh ...
#
# Stopping: each remote command prints its pid first (the shell then execs the launcher, so that
# pid is the launcher's). Ctrl-C or SIGTERM sends SIGTERM to those pids only, over new ssh
# connections, after checking that the process carries this run's id in its environment; the
# launchers stop their workers gracefully. A second Ctrl-C, or --grace running out, sends SIGKILL
# (the launcher's orphan guard then kills its workers). Nothing is killed by name. As with
# srun --kill-on-bad-exit, the first host whose launcher fails gets the others stopped. Exit status:
# 130/143 after Ctrl-C/SIGTERM, else the exit status of the first host that failed, else 0.
set -uo pipefail

usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "launch_hosts: error: $*" >&2; exit 2; }

hostfile="" rdzv=static port=29500 chdir=$PWD python=${PYTHON:-python3} grace=45 names=()
while [ $# -gt 0 ]; do
    case $1 in
        -f|--hostfile) [ $# -ge 2 ] || die "$1 needs a file"; hostfile=$2; shift 2 ;;
        -e|--env) [ $# -ge 2 ] || die "$1 needs a variable name"; IFS=, read -ra more <<< "$2"; names+=("${more[@]}"); shift 2 ;;
        -p|--master_port|--master-port) [ $# -ge 2 ] || die "$1 needs a port"; port=$2; shift 2 ;;
        --rdzv) [ $# -ge 2 ] || die "$1 needs static or c10d"; rdzv=$2; shift 2 ;;
        -C|--chdir) [ $# -ge 2 ] || die "$1 needs a folder"; chdir=$2; shift 2 ;;
        --python) [ $# -ge 2 ] || die "$1 needs an interpreter"; python=$2; shift 2 ;;
        --grace) [ $# -ge 2 ] || die "$1 needs seconds"; grace=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
[ -n "$hostfile" ] || die "missing -f HOSTFILE (see --help)"
[ -r "$hostfile" ] || die "cannot read the hostfile $hostfile"
[ $# -gt 0 ] || die "missing the launcher flags and training script after --"
[[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "--master_port $port is not a port number"
[ "$rdzv" = static ] || [ "$rdzv" = c10d ] || die "--rdzv $rdzv is not static or c10d"
[[ $grace =~ ^[0-9]+$ ]] || die "--grace $grace is not a whole number of seconds"
for n in "${names[@]}"; do [[ $n =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "-e $n is not a variable name"; done
read -ra SSH_CMD <<< "${SSH:-ssh}"
[ ${#SSH_CMD[@]} -gt 0 ] || die "SSH is empty"

# --- the hosts
hosts=() slots=() lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    line=${line%%#*}
    read -ra words <<< "$line"
    [ ${#words[@]} -gt 0 ] || continue
    n=""
    for w in "${words[@]:1}"; do
        case $w in
            slots=*) n=${w#slots=}; [[ $n =~ ^[1-9][0-9]*$ ]] || die "$hostfile:$lineno: slots=$n is not a positive number" ;;
            *) die "$hostfile:$lineno: unknown field '$w' (expected: host [slots=N])" ;;
        esac
    done
    hosts+=("${words[0]}") slots+=("$n")
done < "$hostfile"
N=${#hosts[@]}
[ "$N" -gt 0 ] || die "no hosts in $hostfile"
master=${hosts[0]#*@}  # user@host -> host
if [ "$rdzv" = static ] && [ "$(printf '%s\n' "${slots[@]}" | sort -u | wc -l)" -gt 1 ]; then
    die "the hosts have different slots ($(IFS=,; echo "${slots[*]}")); the static rendezvous needs the same number of workers on every host: use --rdzv c10d"
fi

# --- the remote command, quoted for a POSIX shell
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
run_id="launch_hosts-$(hostname)-$$-$RANDOM$RANDOM"
exports="export LAUNCH_HOSTS_ID=$(q "$run_id");"
forward=("${names[@]}")
while IFS= read -r n; do forward+=("$n"); done < <(compgen -e | grep -E '^(PET|NCCL|GLOO|TORCH)_' || true)
declare -A seen=()
for n in "${forward[@]}"; do
    [ -n "${seen[$n]:-}" ] && continue; seen[$n]=1
    if [ -n "${!n+set}" ]; then exports+=" export $n=$(q "${!n}");"; else echo "launch_hosts: warning: $n is not set here; not forwarded" >&2; fi
done
user_args=""
for a in "$@"; do user_args+=" $(q "$a")"; done

label() {  # [host], or [host#i] when a host is listed more than once
    local i=$1 h=${hosts[$1]} c=0 x
    for x in "${hosts[@]}"; do [ "$x" = "$h" ] && c=$((c + 1)); done
    if [ "$c" -gt 1 ]; then echo "[$h#$i]"; else echo "[$h]"; fi
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/launch_hosts.XXXXXX") || die "mktemp failed"
readers=()
for i in "${!hosts[@]}"; do
    nproc=${slots[$i]:+--nproc_per_node ${slots[$i]}}
    remote="cd $(q "$chdir") || exit 2; $exports echo \"LAUNCH_HOSTS_PID \$\$\"; exec $(q "$python") -m launcher $nproc"
    if [ "$rdzv" = static ]; then
        remote+=" --nnodes $N --node_rank $i --master_addr $(q "$master") --master_port $port$user_args"
    else
        remote+=" --nnodes $N --rdzv_backend c10d --rdzv_endpoint $(q "$master:$port") --rdzv_id $(q "$run_id")$user_args"
    fi
    tag=$(label "$i")
    (
        # Left of the pipe: ssh, its local pid kept (exec keeps the subshell's). Right: the first
        # line is the remote pid, kept for the stop; every other line is printed with the prefix.
        { echo "$BASHPID" > "$tmp/ssh.$i"; exec "${SSH_CMD[@]}" "${hosts[$i]}" "$remote" < /dev/null 2>&1; } | {
            while IFS= read -r l; do
                if [[ ! -s $tmp/pid.$i && $l =~ ^LAUNCH_HOSTS_PID\ ([0-9]+)$ ]]; then echo "${BASH_REMATCH[1]}" > "$tmp/pid.$i"; continue; fi
                printf '%s %s\n' "$tag" "${l%$'\r'}"
            done
        }
        echo "${PIPESTATUS[0]}" > "$tmp/rc.$i"
    ) &
    readers+=($!)
done

# --- stopping: SIGTERM to this run's launchers, SIGKILL after --grace s or on a second signal
signal_remote() {  # SIG: signal the launchers of the hosts still running, in parallel
    local sig=$1 i pid check kills=()
    for i in "${!hosts[@]}"; do
        [ -s "$tmp/rc.$i" ] && continue
        pid=$(cat "$tmp/pid.$i" 2>/dev/null) && [ -n "$pid" ] || continue
        # only if that pid is still this run's launcher: the run id is in its environment
        check="if tr '\\0' '\\n' < /proc/$pid/environ 2>/dev/null | grep -qx LAUNCH_HOSTS_ID=$(q "$run_id"); then kill -$sig $pid; fi"
        "${SSH_CMD[@]}" "${hosts[$i]}" "$check" < /dev/null > /dev/null 2>&1 &
        kills+=($!)
    done
    [ ${#kills[@]} -eq 0 ] || wait "${kills[@]}" 2>/dev/null
}
status="" failed="" kill_at="" give_up_at=""
stop_all() {  # SIGTERM now, SIGKILL in $grace s
    local t=0 i
    kill_at=$(( $(date +%s) + grace ))
    for i in "${!hosts[@]}"; do  # a host that has not printed its pid yet will in a moment
        while [ ! -s "$tmp/pid.$i" ] && [ ! -s "$tmp/rc.$i" ] && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    done
    signal_remote TERM
}
on_stop() {  # INT/TERM/HUP here: stop them all; a second one: SIGKILL
    local sig=$1
    if [ -n "$status" ]; then
        echo "launch_hosts: SIG$sig again: killing the launchers" >&2
        signal_remote KILL; kill_at="" give_up_at=$(( $(date +%s) + 10 )); return
    fi
    status=$([ "$sig" = INT ] && echo 130 || echo 143)
    echo "launch_hosts: SIG$sig: stopping the launchers on $N host(s) (SIGKILL in $grace s)" >&2
    [ -n "$kill_at" ] || stop_all
}
trap 'on_stop INT' INT
trap 'on_stop TERM' TERM
trap 'on_stop HUP' HUP
kill_ssh() {  # local leftovers only: the ssh clients of hosts that never ended, by recorded pid
    local i
    for i in "${!hosts[@]}"; do
        [ -s "$tmp/rc.$i" ] || [ ! -s "$tmp/ssh.$i" ] || kill "$(cat "$tmp/ssh.$i")" 2>/dev/null
    done
}
trap 'kill_ssh; rm -rf "$tmp"' EXIT

# --- wait for every host (bash runs the traps between these short sleeps)
while :; do
    left=0
    for i in "${!hosts[@]}"; do
        if [ ! -s "$tmp/rc.$i" ]; then left=$((left + 1)); continue; fi
        # Like srun --kill-on-bad-exit: the first host that fails stops the others, which would
        # otherwise wait for a dead peer; its exit status becomes this script's.
        r=$(cat "$tmp/rc.$i")
        if [ "$r" != 0 ] && [ -z "$failed$status" ]; then
            failed=$r
            echo "launch_hosts: $(label "$i") exited with $r; stopping the other hosts" >&2
            stop_all
        fi
    done
    [ $left -eq 0 ] && break
    now=$(date +%s)
    if [ -n "$kill_at" ] && [ "$now" -ge "$kill_at" ]; then
        echo "launch_hosts: still running after $grace s: killing the launchers" >&2
        signal_remote KILL; kill_at="" give_up_at=$((now + 10))
    fi
    if [ -n "$give_up_at" ] && [ "$now" -ge "$give_up_at" ]; then
        echo "launch_hosts: $left host(s) do not answer; leaving" >&2; kill_ssh; break
    fi
    sleep 0.2
done

wait "${readers[@]}" 2>/dev/null  # their last lines are out (at once, unless we gave up)
exit "${status:-${failed:-0}}"
