#!/usr/bin/env bash
# A one-node SLURM cluster on this host for tests: Debian's slurmctld,
# slurmd and munge (SLURM 22.05), started directly (no systemd), as root.
# usage: cluster.sh start DIR   installs what is missing (Debian packages),
#                               writes DIR/slurm.conf, starts munged,
#                               slurmctld and slurmd (their pids in DIR),
#                               waits until the node is idle; prints
#                               "SLURM_CONF=DIR/slurm.conf"
#        cluster.sh stop DIR    stops the daemons that start started
# Exit 77 with one line when SLURM cannot run here (not root, or its
# packages cannot be installed). The
# configuration: this host's cores as consumable (select/cons_tres,
# CR_Core), tasks bound to their cores (task/affinity), processes tracked
# without cgroups (proctrack/linuxproc), PMIx as the default MPI plugin
# (Debian's slurm-wlm-basic-plugins ships mpi_pmix_v4), ports 16817/16818,
# munge with a key and a socket of its own in DIR, no accounting.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
  for d in slurmd slurmctld munged; do
    if [ -f "$dir/$d.pid" ]; then
      pid=$(cat "$dir/$d.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$d.pid"
    fi
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "SKIP: a test SLURM needs root (its daemons run as root here)"; exit 77; }

need=()
for p in slurmctld slurmd slurm-client munge; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >"$dir/apt.log" 2>&1 ||
    { tail -5 "$dir/apt.log"; echo "SKIP: apt-get install ${need[*]} failed (no Debian mirror?): no SLURM to test against"; exit 77; }
fi

host=$(hostname -s)
# The node as slurmd sees this machine (not nproc: it follows
# OMP_NUM_THREADS): CPUs, sockets, cores, threads; 90% of its memory.
hw=$(slurmd -C | head -1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
mungekey --create --keyfile="$dir/munge/munge.key"  # a key of its own
cat >"$dir/slurm.conf" <<CONF
ClusterName=memtrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 $hw RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" --key-file="$dir/munge/munge.key"
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$dir/slurm.conf"
slurmd -f "$dir/slurm.conf"
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || { tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2; stop; echo "cluster.sh: node not idle ($state)" >&2; exit 1; }
echo "SLURM_CONF=$dir/slurm.conf"
