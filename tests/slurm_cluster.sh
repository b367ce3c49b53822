#!/usr/bin/env bash
# Real Slurm (Debian bookworm slurm-wlm 22.05) on localhost, for tests/e2e/test_slurm.py.
# (Adapted from the team's feasibility notes on Slurm-on-localhost; kept in the repo so CI has it.)
# One slurmctld + N slurmd ("multiple-slurmd": N fake nodes node1..nodeN on this host,
# each slurmd on its own port) + one munged.  All state/logs/pids under $SLURM_LOCAL_DIR,
# config in /etc/slurm/slurm.conf, all listening sockets on 127.0.0.1 only.
# Needs root.  No systemd needed (daemons are started directly, PIDs recorded in pidfiles).
#
#   sudo bash tests/slurm_cluster.sh          # install (if needed) + configure + start; idempotent
#   sudo bash tests/slurm_cluster.sh stop     # teardown: cancel jobs, kill our daemons by PID (from their
#                                             # pidfiles), drop the /etc/hosts line this script added
#   sudo bash tests/slurm_cluster.sh status
#
# Knobs (env):  SLURM_LOCAL_NODES=2   number of fake nodes (1 => one node called "localhost")
#               SLURM_LOCAL_CPUS=$(nproc) CPUs per fake node (may exceed real cores)
#               SLURM_LOCAL_MEM=2000  RealMemory (MB) per fake node (not enforced)
#               SLURM_LOCAL_DIR=/tmp/slurm-local
#               SLURM_LOCAL_NO_INSTALL=1  skip apt-get
set -euo pipefail

NODES=${SLURM_LOCAL_NODES:-2}
CPUS=${SLURM_LOCAL_CPUS:-$(nproc)}
MEM=${SLURM_LOCAL_MEM:-2000}
D=${SLURM_LOCAL_DIR:-/tmp/slurm-local}
CONF=/etc/slurm/slurm.conf
CTLD_PORT=16817
BASE_PORT=17000            # slurmd of node i listens on BASE_PORT+i
MUNGE_SOCK=$D/munge/munge.socket.2

log() { echo "[slurm-local] $*" >&2; }

if [ "$NODES" -eq 1 ]; then NAMES=(localhost); else NAMES=(); for i in $(seq 1 "$NODES"); do NAMES+=("node$i"); done; fi

# --- helpers: PIDs come from the daemons' own pidfiles; a PID is only used if
#     /proc/PID/exe is the expected binary (guards against PID reuse).
pid_of() {  # pidfile expected-exe
  local f=$1 exe=$2 p
  [ -s "$f" ] || return 1
  p=$(cat "$f"); [ -n "$p" ] && [ -d "/proc/$p" ] || return 1
  [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$(readlink -f "$exe")" ] || return 1   # /usr/sbin/slurmd -> slurmd-wlm
  echo "$p"
}
kill_pids() {  # TERM the given PIDs together, wait up to 10s, then KILL leftovers
  local p i left
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for i in $(seq 1 100); do
    left=""; for p in "$@"; do [ -d "/proc/$p" ] && left="$left $p"; done
    [ -z "$left" ] && return 0; sleep 0.1
  done
  log "SIGKILL$left"; kill -9 $left 2>/dev/null || true
}
all_pidfiles() {  # "pidfile exe" lines, slurmds first, munged last
  local n
  for n in $(ls "$D/run" 2>/dev/null | sed -n 's/^slurmd-\(.*\)\.pid$/\1/p'); do echo "$D/run/slurmd-$n.pid /usr/sbin/slurmd"; done
  echo "$D/run/slurmctld.pid /usr/sbin/slurmctld"
  echo "$D/munge/munged.pid /usr/sbin/munged"
}
stop_all() {
  if pid_of "$D/run/slurmctld.pid" /usr/sbin/slurmctld >/dev/null; then
    # cancel every job first so no slurmstepd / task processes are left behind
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      log "cancelling jobs: $(echo $jobs)"; scancel $jobs 2>/dev/null || true
      for _ in $(seq 1 150); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  local f e p pids=()
  while read -r f e; do   # slurmds + slurmctld together (each takes ~2s to exit on SIGTERM)
    [ "$e" = /usr/sbin/munged ] && continue
    if p=$(pid_of "$f" "$e"); then log "kill $p ($e)"; pids+=("$p"); fi; rm -f "$f"
  done < <(all_pidfiles)
  kill_pids "${pids[@]}"
  if p=$(pid_of "$D/munge/munged.pid" /usr/sbin/munged); then log "kill $p (munged)"; kill_pids "$p"; fi
  rm -f "$D/munge/munged.pid"
  # A munged whose pid file is gone (a stop racing another) still holds the socket's lock, and the
  # next start fails on it: find ours by the socket it was started on
  local stray; stray=$(pgrep -u munge -f -- "--socket=$MUNGE_SOCK" || true)
  if [ -n "$stray" ]; then log "kill $(echo $stray) (munged without a pid file)"; kill_pids $stray; fi
}
status() {
  local f e p
  while read -r f e; do p=$(pid_of "$f" "$e") && echo "$(basename "$f" .pid) pid=$p" || echo "$(basename "$f" .pid) DOWN"; done < <(all_pidfiles)
}

case "${1:-start}" in
  stop) stop_all
        if grep -q '# slurm-local$' /etc/hosts 2>/dev/null; then   # cat >, not sed -i: works on a bind-mounted /etc/hosts
          t=$(mktemp); grep -v '# slurm-local$' /etc/hosts > "$t" || true; cat "$t" > /etc/hosts; rm -f "$t"; fi
        log "stopped"; exit 0 ;;
  status) status; exit 0 ;;
  start) ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac

[ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }

# --- 1. packages (slurmctld+slurmd+client+munge; --no-install-recommends skips ~20 plugin/-dev pkgs)
if [ -z "${SLURM_LOCAL_NO_INSTALL:-}" ] && ! { command -v slurmctld && command -v slurmd && command -v srun && command -v munged; } >/dev/null 2>&1; then
  log "installing packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

# --- 2. config
mkdir -p "$D"/{state,log,run,munge} /etc/slurm
for n in "${NAMES[@]}"; do mkdir -p "$D/spool/$n"; done
chown munge:munge "$D/munge"; chmod 0755 "$D/munge"
[ -s /etc/munge/munge.key ] || { log "creating munge key"; mungekey --create --force 2>/dev/null || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; }; }
chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key

# fake node names must resolve (a launcher takes MASTER_ADDR from `scontrol show hostnames`)
if [ "$NODES" -gt 1 ]; then
  missing=""; for n in "${NAMES[@]}"; do [ "$(getent hosts "$n" | awk '{print $1; exit}')" = 127.0.0.1 ] || missing="$missing $n"; done
  [ -z "$missing" ] || { log "adding to /etc/hosts: 127.0.0.1$missing"; echo "127.0.0.1$missing  # slurm-local" >> /etc/hosts; }
fi

NEWCONF=$(mktemp)
cat > "$NEWCONF" <<EOF
# generated by slurm_cluster.sh
ClusterName=localcluster
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
OverTimeLimit=0
MinJobAge=300
InactiveLimit=0
EOF
i=0
for n in "${NAMES[@]}"; do
  i=$((i+1))
  echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((BASE_PORT+i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN" >> "$NEWCONF"
done
echo "PartitionName=debug Nodes=$(IFS=,; echo "${NAMES[*]}") Default=YES MaxTime=INFINITE State=UP" >> "$NEWCONF"

# --- 3. daemons: if everything is up with an identical config, do nothing
all_up() {
  pid_of "$D/munge/munged.pid" /usr/sbin/munged >/dev/null && pid_of "$D/run/slurmctld.pid" /usr/sbin/slurmctld >/dev/null || return 1
  local n; for n in "${NAMES[@]}"; do pid_of "$D/run/slurmd-$n.pid" /usr/sbin/slurmd >/dev/null || return 1; done
}
if cmp -s "$NEWCONF" "$CONF" && all_up; then
  rm -f "$NEWCONF"; log "already running with this config"; status; exit 0
fi
stop_all
mv "$NEWCONF" "$CONF"; chmod 0644 "$CONF"

log "starting munged"
runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCK" --pid-file="$D/munge/munged.pid" \
  --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed"
munge -S "$MUNGE_SOCK" -n | unmunge -S "$MUNGE_SOCK" >/dev/null

log "starting slurmctld"
(cd "$D" && /usr/sbin/slurmctld -c)          # -c: discard job/node state of a previous run
for _ in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
scontrol ping | grep -q UP || { tail -20 "$D/log/slurmctld.log" >&2; exit 1; }

for n in "${NAMES[@]}"; do log "starting slurmd -N $n"; (cd "$D" && /usr/sbin/slurmd -N "$n"); done

for _ in $(seq 1 150); do
  [ "$(sinfo -h -N -o '%N %T' | grep -cw idle)" -ge "$NODES" ] && break; sleep 0.2
done
sinfo -N
[ "$(sinfo -h -N -o '%N %T' | grep -cw idle)" -ge "$NODES" ] || { log "nodes not idle"; tail -20 "$D"/log/slurm*.log >&2; exit 1; }
status
log "ready"
