#!/usr/bin/env bash
# Several "nodes" on this one machine, for memtrain's multi-node tests and
# benchmarks: each node is a Linux network namespace (its own interface and
# address) with a UTS namespace (its own hostname) and a mount namespace
# (its own scratch folder), joined by a bridge of veth pairs. Addresses are
# from the benchmarking range 198.18.0.0/15 only; the bridge has no
# physical port and the nodes no default route, so no packet leaves this
# machine. Root only.
#
# usage: cluster.sh up DIR N       N (1-8) nodes node1..nodeN; writes
#                                  DIR/cluster.env (sourced by the tests),
#                                  DIR/hostfile (N lines "nodeK slots=S"),
#                                  DIR/agent (Open MPI's launcher agent:
#                                  plm_rsh_agent), DIR/shared (seen by every
#                                  node, the output folder) and DIR/scratch
#                                  (each node's own: DIR/nodes/nodeK/scratch
#                                  mounted there in nodeK)
#        cluster.sh down DIR       kills every process in the nodes, removes
#                                  the namespaces, veths, bridge and mounts;
#                                  also after a crashed run (idempotent)
#        cluster.sh exec DIR NODE CMD ...
#                                  runs CMD on NODE (its net, hostname,
#                                  mounts; pinned to the node's cores,
#                                  unless MT_PIN=0)
#        cluster.sh kill DIR NODE  kills every process on NODE (a crash:
#                                  its sockets close, its link stays up)
#        cluster.sh link DIR NODE up|down
#                                  cuts or restores NODE's link (a partition:
#                                  no process dies)
#        cluster.sh shape DIR RATE|off
#                                  caps every node's link at RATE (tc tbf,
#                                  both directions, e.g. 1gbit) or removes
#                                  the cap
#        cluster.sh check DIR      exit 1 naming what of DIR's cluster is
#                                  still there (namespaces, bridge, mounts,
#                                  processes)
# Exit 77 with one line where namespaces cannot be made here: "SKIP
# (machine): ..." where the machine cannot give them (not root, the kernel
# refuses network namespaces, a bridge or a veth pair), "SKIP: ..." where a
# program is missing (ip, unshare, nsenter, setsid, taskset, mount,
# hostname), which launch/install_deps.sh installs (tests/tools/skips.py).
# Each node gets its share of this machine's cores: node K of N the CPUs
# [K*C/N, (K+1)*C/N) when N <= C cores, else CPU (K-1) mod C.
set -euo pipefail
usage() {
  sed -n '9,42p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
case "$cmd" in up | down | exec | kill | link | shape | check) ;; *) usage ;; esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Names unique to DIR (two clusters may coexist), within IFNAMSIZ (15).
tag=mt$(printf '%s' "$dir" | md5sum | cut -c1-5)
bridge=${tag}br
# The cluster's /24 of 198.18.0.0/15: the one its cluster.env names, else
# the first free one from a number drawn from the tag, so that two clusters
# (two tests at once) never share a subnet.
subnet=
if [ -f "$dir/cluster.env" ]; then
  subnet=$(sed -n 's/^MT_SUBNET=\(.*\)\.0\/24$/\1/p' "$dir/cluster.env")
fi
if [ -z "$subnet" ]; then
  used=$(ip -4 -o addr show 2>/dev/null | awk '{print $4}')
  start=$((0x$(printf '%s' "$dir" | md5sum | cut -c6-8) % 512))
  for i in $(seq 0 511); do
    x=$(((start + i) % 512))
    candidate=198.$((18 + x / 256)).$((x % 256))
    grep -q "^${candidate//./\\.}\." <<<"$used" || { subnet=$candidate; break; }
  done
fi
gateway=$subnet.254

skip() {  # KIND WHY: machine (what this machine cannot give) or other
  if [ "$1" = machine ]; then echo "SKIP (machine): $2"; else echo "SKIP: $2"; fi
  exit 77
}

node_ns() { echo "${tag}n$1"; }

# CPUs of node K (1-based) of N, as a taskset list.
node_cpus() {
  local k=$1 n=$2 c
  c=$(nproc --all)
  if [ "$n" -le "$c" ]; then
    local lo=$(((k - 1) * c / n)) hi=$((k * c / n - 1))
    echo "$lo-$hi"
  else
    echo $(((k - 1) % c))
  fi
}

# Every mount of DIR's namespaces, deepest first.
our_mounts() {
  awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r
}

down() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk -v t="$tag" 'index($1, t) == 1 {print $1}'); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    ip netns del "$ns" 2>/dev/null || true
  done
  # A namespace's veth pairs go with it, but the kernel removes them
  # later: delete what is left, and wait until it is gone.
  local v
  for v in $(ip -o link show 2>/dev/null | awk -F': ' -v t="${tag}v" 'index($2, t) == 1 {sub(/@.*/, "", $2); print $2}'); do
    ip link del "$v" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  for _ in $(seq 50); do
    ip -o link show 2>/dev/null | grep -q "${tag}[vb]" || break
    sleep 0.1
  done
  for m in $(our_mounts); do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$dir/ns"
}

check() {
  local left=()
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v t="$tag" 'index($1, t) == 1 {print $1}'); do
    left+=("namespace $ns (processes: $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' '))")
  done
  ip link show "$bridge" >/dev/null 2>&1 && left+=("bridge $bridge")
  ip -o link show 2>/dev/null | grep -q "${tag}v" && left+=("veths ${tag}v*")
  local m
  for m in $(our_mounts); do left+=("mount $m"); done
  if [ ${#left[@]} -gt 0 ]; then
    printf 'cluster.sh: left behind: %s\n' "${left[@]}" >&2
    return 1
  fi
}

env_file() {
  [ -f "$dir/cluster.env" ] || { echo "cluster.sh: no cluster in $dir (cluster.sh up $dir N first)" >&2; exit 2; }
  # shellcheck disable=SC1091
  source "$dir/cluster.env"
}

# The process that holds node K's hostname and mount namespaces (and sits
# in its network namespace): `exec` enters through it from anywhere, also
# from inside another node (mpirun started on node1).
node_holder() {
  local pid
  pid=$(cat "$dir/ns/node$1.pid" 2>/dev/null) && [ -d "/proc/$pid" ] ||
    { echo "cluster.sh: node$1 is gone (its namespace holder ended; cluster.sh down $dir, then up)" >&2; exit 2; }
  echo "$pid"
}

# The node's number from its name (node3 -> 3), checked against the cluster.
node_number() {
  local k=${1#node}
  [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le "$MT_NODES" ] ||
    { echo "cluster.sh: no node '$1' (node1..node$MT_NODES)" >&2; exit 2; }
  echo "$k"
}

case "$cmd" in
  down)
    down
    exit 0
    ;;
  check)
    check
    exit $?
    ;;
  exec)
    env_file
    node=${3:-}
    [ $# -ge 4 ] || usage
    k=$(node_number "$node")
    shift 3
    pin=(taskset -c "$(node_cpus "$k" "$MT_NODES")")
    [ "${MT_PIN:-1}" != 0 ] || pin=()
    holder=$(node_holder "$k")
    exec nsenter -t "$holder" --net --uts --mount --wd="$(pwd)" -- "${pin[@]}" "$@"
    ;;
  kill)
    env_file
    k=$(node_number "${3:-}")
    holder=$(node_holder "$k")
    pids=$(ip netns pids "$(node_ns "$k")" | grep -vx "$holder" || true)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    echo "cluster.sh: node$k: killed $(echo $pids | wc -w) process(es)"
    exit 0
    ;;
  link)
    env_file
    k=$(node_number "${3:-}")
    state=${4:-}
    [ "$state" = up ] || [ "$state" = down ] || usage
    ip link set "${tag}v$k" "$state"
    exit 0
    ;;
  shape)
    env_file
    rate=${3:-}
    [ -n "$rate" ] || usage
    for k in $(seq "$MT_NODES"); do
      for side in host node; do
        if [ $side = host ]; then run=(); dev=${tag}v$k; else run=(ip netns exec "$(node_ns "$k")"); dev=eth0; fi
        "${run[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
        [ "$rate" = off ] && continue
        # A bucket of 2 ms at RATE, at least 256 KiB (a few TSO segments:
        # a smaller one holds a 10gbit link to 7 Gbit/s here), and up to
        # 5 ms of queue before drops.
        burst=$(python3 -c "
import re, sys
m = re.fullmatch(r'([0-9.]+)([kmg])bit', sys.argv[1])
if not m: sys.exit('cluster.sh: a rate is N kbit, mbit or gbit, not ' + sys.argv[1])
bits = float(m[1]) * {'k': 1e3, 'm': 1e6, 'g': 1e9}[m[2]]
print(max(256 * 1024, int(bits / 8 * 0.002)))" "$rate")
        "${run[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 5ms
      done
    done
    exit 0
    ;;
esac

# up
n=${3:-}
[[ "$n" =~ ^[1-8]$ ]] || { echo "cluster.sh: N must be 1 to 8 nodes, not '$n'" >&2; exit 2; }
[ "$(id -u)" = 0 ] || skip machine "network namespaces need root (this is uid $(id -u))"
for t in ip unshare nsenter setsid taskset mount hostname; do
  command -v "$t" >/dev/null || skip other "no '$t' on this machine (Debian: iproute2, util-linux, mount, hostname)"
done
down  # what a killed earlier run left
trap 'rc=$?; [ $rc = 0 ] || [ $rc = 77 ] || down; exit $rc' EXIT
# What the kernel must offer, tried in a namespace of its own first (it
# takes its links with it when it goes).
err=$(ip netns add "${tag}probe" 2>&1) || skip machine "the kernel refuses network namespaces (ip netns add: $err)"
for what in "bridge:type bridge" "veth pair:type veth peer name ${tag}pp"; do
  err=$(ip -n "${tag}probe" link add "${tag}pl" ${what#*:} 2>&1) ||
    { ip netns del "${tag}probe"; skip machine "the kernel makes no ${what%%:*} (ip link add ... ${what#*:}: $err)"; }
  ip -n "${tag}probe" link del "${tag}pl"
done
ip netns del "${tag}probe"

mkdir -p "$dir/ns" "$dir/shared" "$dir/scratch"
ip link add "$bridge" type bridge
ip addr add "$gateway/24" dev "$bridge"
ip link set "$bridge" up
: >"$dir/hostfile"
: >"$dir/hosts"
slots=$(($(nproc --all) / n))
[ "$slots" -ge 1 ] || slots=1
for k in $(seq "$n"); do
  ns=$(node_ns "$k")
  ip netns add "$ns"
  ip link add "${tag}v$k" type veth peer name eth0 netns "$ns"
  ip link set "${tag}v$k" master "$bridge" up
  ip -n "$ns" addr add "$subnet.$k/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # TCP gives up on an unanswered peer after 6 retransmissions (about 25 s;
  # Linux's default, 15, is about 15 min): how long mpirun and its daemons
  # take to notice a node cut off (tests/multinode/node_lost.sh).
  ip netns exec "$ns" sh -c 'echo "$1" >/proc/sys/net/ipv4/tcp_retries2' sh "${MT_TCP_RETRIES2:-6}"
  mkdir -p "$dir/nodes/node$k/scratch"
  echo "node$k slots=$slots" >>"$dir/hostfile"
  echo "$subnet.$k node$k" >>"$dir/hosts"
done
# Every node reaches every other by name: a hosts file in each node's own
# mount namespace (this machine's /etc/hosts is not touched).
cat /etc/hosts "$dir/hosts" >"$dir/nodes/hosts"
echo "$gateway head" >>"$dir/nodes/hosts"
# Each node's hostname and mounts live in a holder process (sleep, in the
# node's network namespace) that `exec` enters: its hostname, its scratch
# folder on DIR/scratch, the hosts file on /etc/hosts. A file-held mount
# namespace could not be entered from inside another node (the later
# nodes' files are not in the earlier nodes' mount trees).
for k in $(seq "$n"); do
  pidfile=$dir/ns/node$k.pid
  setsid nsenter --net="/run/netns/$(node_ns "$k")" unshare --uts --mount --propagation private /bin/sh -c \
    'hostname "$1" && mount --bind "$2" "$3" && mount --bind "$4" /etc/hosts &&
     echo $$ >"$5.tmp" && mv "$5.tmp" "$5" && exec sleep infinity' \
    holder "node$k" "$dir/nodes/node$k/scratch" "$dir/scratch" "$dir/nodes/hosts" "$pidfile" \
    </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do
    [ -f "$pidfile" ] && break
    sleep 0.05
  done
  [ -f "$pidfile" ] || { echo "cluster.sh: node$k's namespaces could not be made (unshare --uts --mount failed)" >&2; exit 1; }
done

# Open MPI's launcher agent: called as `agent [options] HOST COMMAND...` in
# place of ssh; runs COMMAND in HOST's namespaces through a shell, as sshd
# would. Like ssh it must reach the host over the network first: a TCP
# connection to its port 22 (refused at once when the host answers; no
# answer within 5 s, or no route, when it is cut off).
cat >"$dir/agent" <<AGENT
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case "\$host" in
  node[0-9]*) ;;
  *) echo "agent: no node '\$host' in $dir (node1..node$n)" >&2; exit 255 ;;
esac
addr=\$(awk -v h="\$host" '\$2 == h {print \$1}' "$dir/hosts")
err=\$(timeout 5 bash -c "exec 3<>/dev/tcp/\$addr/22" 2>&1)
rc=\$?
if [ \$rc = 124 ] || [[ "\$err" == *"No route"* ]] || [[ "\$err" == *nreachable* ]]; then
  echo "agent: connect to host \$host (\$addr) port 22: no answer within 5 s" >&2
  exit 255
fi
exec "$dir/cluster.sh" exec "$dir" "\$host" /bin/sh -c "\$*"
AGENT
chmod +x "$dir/agent"
# The cluster.sh the agent calls: this one, wherever the tests run it from.
cp "$0" "$dir/cluster.sh"

cat >"$dir/cluster.env" <<ENV
MT_NODES=$n
MT_CLUSTER=$dir
MT_TAG=$tag
MT_BRIDGE=$bridge
MT_GATEWAY=$gateway
MT_SUBNET=$subnet.0/24
MT_HOSTFILE=$dir/hostfile
MT_SHARED=$dir/shared
MT_SCRATCH=$dir/scratch
# Open MPI across the nodes: mpirun "\${MT_MPI_ARGS[@]}" --hostfile
# \$MT_HOSTFILE -np N ... starts its daemons through the agent, not ssh
# (each from the head: no tree spawn), keeps TCP between hosts on the
# bridge's subnet, and leaves the ranks on their node's cores (no binding
# of its own). A hostfile of fewer lines runs on fewer nodes.
MT_MPI_ARGS=(--mca plm_rsh_agent $dir/agent
  --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $subnet.0/24
  --mca btl self,vader,tcp --mca btl_tcp_if_include $subnet.0/24 --bind-to none)
# Ranks started otherwise (srun) need TCP between hosts too, whatever a
# one-host setting (the tests' OMPI_MCA_btl=self,vader) said.
export OMPI_MCA_btl=self,vader,tcp
ENV
trap - EXIT
echo "cluster.sh: $n node(s) up in $dir: $(tr '\n' ' ' <"$dir/hostfile")"
