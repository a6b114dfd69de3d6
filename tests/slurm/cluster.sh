#!/usr/bin/env bash
# A SLURM cluster on this host for tests: Debian's slurmctld, slurmd and
# munge (SLURM 22.05), started directly (no systemd), as root.
# usage: cluster.sh start DIR [N]
#                               installs what is missing (Debian packages),
#                               writes DIR/slurm.conf, starts munged,
#                               slurmctld and N slurmd (their pids in DIR),
#                               waits until the nodes are idle; prints
#                               "SLURM_CONF=DIR/slurm.conf". N=1 (the
#                               default): one node, this host, on
#                               127.0.0.1. N=2..8: nodes node1..nodeN of
#                               tests/multinode/cluster.sh in DIR/net (each
#                               its own network, hostname and mounts;
#                               198.18.0.K), one slurmd in each (-N nodeK),
#                               slurmctld on the bridge (198.18.0.254);
#                               DIR/net/cluster.env describes them
#        cluster.sh stop DIR    stops the daemons that start started (and
#                               removes DIR/net's nodes)
# Exit 77 with one line when SLURM cannot run here (not root, no
# namespaces for N > 1, or its packages cannot be installed). The
# configuration: this host's cores as consumable (select/cons_tres,
# CR_Core), tasks bound to their cores (task/affinity), processes tracked
# without cgroups (proctrack/linuxproc), PMIx as the default MPI plugin
# (Debian's slurm-wlm-basic-plugins ships mpi_pmix_v4), ports 16817/16818,
# munge with a key and a socket of its own in DIR, no accounting. With N
# nodes each is given all of this host's cores and 1/N of its memory (the
# nodes share the cores: each slurmd binds its tasks among them).
set -euo pipefail
cmd=${1:-}
dir=${2:-}
nodes=${3:-1}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR [N]" >&2; exit 2; }
[[ "$nodes" =~ ^[1-8]$ ]] || { echo "cluster.sh: N must be 1 to 8 nodes, not '$nodes'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
  local f pid
  for f in "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
    if [ -f "$f" ]; then
      pid=$(cat "$f")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$f"
    fi
  done
  [ ! -d "$dir/net" ] || bash "$here/../multinode/cluster.sh" down "$dir/net"
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "SKIP (machine): a test SLURM needs root (its daemons run as root here)"; exit 77; }

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
# OMP_NUM_THREADS): CPUs, sockets, cores, threads; 90% of its memory,
# shared out among the nodes.
hw=$(slurmd -C | head -1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')
mem=$(awk -v n="$nodes" '/MemTotal/ {print int($2 / 1024 * 0.9 / n)}' /proc/meminfo)
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
mungekey --create --keyfile="$dir/munge/munge.key"  # a key of its own
tmp_line=
if [ "$nodes" = 1 ]; then
  ctl_addr=127.0.0.1
  node_lines="NodeName=$host NodeAddr=127.0.0.1 $hw RealMemory=$mem State=UNKNOWN"
  spool=$dir/spool
  slurmd_pid=$dir/slurmd.pid
  slurmd_log=$dir/slurmd.log
else
  rc=0
  bash "$here/../multinode/cluster.sh" up "$dir/net" "$nodes" >"$dir/net.log" 2>&1 || rc=$?
  [ "$rc" = 77 ] && { cat "$dir/net.log"; exit 77; }
  [ "$rc" = 0 ] || { cat "$dir/net.log" >&2; echo "cluster.sh: the nodes' namespaces: exit $rc" >&2; exit 1; }
  source "$dir/net/cluster.env"
  ctl_addr=$MT_GATEWAY
  node_lines=
  for k in $(seq "$nodes"); do
    node_lines+="NodeName=node$k NodeAddr=${MT_GATEWAY%.*}.$k $hw RealMemory=$mem State=UNKNOWN"$'\n'
  done
  # One slurmd per node: its own spool, pid and log (%n: the node's name).
  spool=$dir/spool/%n
  slurmd_pid=$dir/slurmd-%n.pid
  slurmd_log=$dir/slurmd-%n.log
  # Each node's own temporary folder (PMIx keeps its per-step folders
  # there, named by job and step alone: on a shared /tmp the nodes' would
  # collide): the nodes' scratch, the same path with each node's contents.
  tmp_line="TmpFS=$MT_SCRATCH"
fi
# cred_expire: a job credential's lifetime, which is also how long a
# requeued job waits before it starts again (120 s by default, man
# slurm.conf): 30 s, so that the preemption test's requeue starts soon
# and a step launched on a loaded machine still finds its credential valid.
cat >"$dir/slurm.conf" <<CONF
ClusterName=memtrain-test
SlurmctldHost=$host($ctl_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=30
CredType=cred/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$slurmd_log
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
$tmp_line
$node_lines
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" --key-file="$dir/munge/munge.key"
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$dir/slurm.conf"
if [ "$nodes" = 1 ]; then
  slurmd -f "$dir/slurm.conf"
else
  for k in $(seq "$nodes"); do
    mkdir -p "$dir/spool/node$k"
    # Not pinned to the node's share of the cores: SLURM binds each task
    # to CPUs by this machine's numbering, which a pinned slurmd refuses.
    MT_PIN=0 bash "$dir/net/cluster.sh" exec "$dir/net" "node$k" slurmd -f "$dir/slurm.conf" -N "node$k"
  done
fi
want=$(printf 'idle%.0s\n' $(seq "$nodes"))
for _ in $(seq 60); do
  state=$(sinfo -h -N -o %T 2>/dev/null || true)
  [ "$state" = "$want" ] && break
  sleep 0.5
done
[ "$state" = "$want" ] || { tail -n 5 "$dir"/slurm*.log >&2; stop; echo "cluster.sh: nodes not idle ($(echo $state))" >&2; exit 1; }
echo "SLURM_CONF=$dir/slurm.conf"
