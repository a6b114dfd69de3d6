#!/usr/bin/env bash
# The sum across nodes, flat against hierarchical, over emulated links:
# tests/multinode/cluster.sh makes N nodes on this machine (namespaces on a
# bridge, 198.18.0.0/15), tc tbf caps each node's link at RATE in both
# directions, and bench_allreduce runs across the nodes with PPN ranks on
# each: its raw call is the flat MPI_Allreduce of all ranks, memtrain's
# Communicator the hierarchical sum (Note [Shared-memory all-reduce]).
# Root only (namespaces, tc).
#
# usage: benchmarks/multinode_allreduce.sh [--nodes "2 4"] [--rates "1gbit 10gbit"]
#          [--ppn 2] [--min-bytes 1048576] [--max-bytes 268435456] [--rounds 3]
#          [--bench build/benchmarks/bench_allreduce] [--out runs/multinode_allreduce]
# Writes OUT/N-nodes-RATE.sizes.csv (bench_allreduce's) and OUT/summary.csv,
# and prints per size: the flat and hierarchical times, hierarchical over
# flat, and each as a fraction of the link's bound. The bound: an
# all-reduce of S bytes over N nodes sends at least 2(N-1)/N x S bytes
# through each node's link (a ring's traffic, in each direction), so it
# takes at least that over RATE. RATE "off" leaves the veths unshaped (what
# this machine's CPUs carry). This kernel may lack netem: no latency is
# added; the nodes' round trip is measured and printed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
nodes_list="2 4"
rates="1gbit 10gbit"
ppn=2
min_bytes=$((1 << 20))
max_bytes=$((256 << 20))
rounds=3
bench=$repo/build/benchmarks/bench_allreduce
out=$repo/runs/multinode_allreduce
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes_list=$2 ;;
    --rates) rates=$2 ;;
    --ppn) ppn=$2 ;;
    --min-bytes) min_bytes=$2 ;;
    --max-bytes) max_bytes=$2 ;;
    --rounds) rounds=$2 ;;
    --bench) bench=$2 ;;
    --out) out=$2 ;;
    *) sed -n '10,13p' "$0" >&2; exit 2 ;;
  esac
  shift 2
done
[ -x "$bench" ] || { echo "multinode_allreduce.sh: $bench not built (bash launch/build.sh)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
source launch/env.sh
cluster=$out/cluster
trap 'bash tests/multinode/cluster.sh down "$cluster"' EXIT
: >"$out/runs.txt"
for n in $nodes_list; do
  bash tests/multinode/cluster.sh up "$cluster" "$n"
  source "$cluster/cluster.env"
  # The round trip between node1 and node2: 2000 one-byte TCP exchanges.
  rtt=$(python3 - "$cluster" <<'PYEOF'
import socket, subprocess, sys, time
c = sys.argv[1]
server = subprocess.Popen(["bash", c + "/cluster.sh", "exec", c, "node2", "python3", "-c",
    "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('0.0.0.0',17999));s.listen(1);a,_=s.accept()\n"
    "a.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
    "while True:\n d=a.recv(1)\n if not d: break\n a.sendall(d)"])
client = subprocess.run(["bash", c + "/cluster.sh", "exec", c, "node1", "python3", "-c",
    "import socket,time\nfor _ in range(100):\n try:\n  s=socket.create_connection(('node2',17999));break\n except OSError: time.sleep(0.05)\n"
    "s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\nt=[]\n"
    "for _ in range(2000):\n a=time.perf_counter();s.sendall(b'x');s.recv(1);t.append(time.perf_counter()-a)\n"
    "t.sort();print(f'{t[len(t)//2]*1e6:.0f} us median, {t[len(t)//10]*1e6:.0f}-{t[len(t)*9//10]*1e6:.0f} us (10th-90th)')"],
    capture_output=True, text=True)
server.wait(timeout=10)
print(client.stdout.strip() or client.stderr.strip())
PYEOF
)
  echo "# $n nodes: round trip node1-node2 (TCP, 1 byte): $rtt" | tee -a "$out/runs.txt"
  for rate in $rates; do
    bash tests/multinode/cluster.sh shape "$cluster" "$rate"
    tag=$n-nodes-$rate
    echo "# $n nodes x $ppn ranks, links $rate: bench_allreduce" | tee -a "$out/runs.txt"
    # An emulated node's ranks share its CPUs (2 ranks on one CPU here):
    # Open MPI's blocking MPI_Allreduce busy-polls unless told to yield, and
    # did not see these nodes as oversubscribed; without the yield the flat
    # sum took 5.6 s for 64 MiB at 10gbit (2 nodes), with it 0.19 s.
    "${MPIEXEC:-mpirun}" "${MT_MPI_ARGS[@]}" --hostfile "$MT_HOSTFILE" --oversubscribe --map-by "ppr:$ppn:node" -np $((n * ppn)) \
      --mca mpi_yield_when_idle 1 \
      "$bench" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --rounds "$rounds" \
      --models '' --csv "$out/$tag" >"$out/$tag.log" 2>&1 ||
      { tail -20 "$out/$tag.log"; echo "multinode_allreduce.sh: bench_allreduce failed ($tag)" >&2; exit 1; }
    grep '^#' "$out/$tag.log" | tee -a "$out/runs.txt"
  done
  bash tests/multinode/cluster.sh down "$cluster"
done
trap - EXIT
bash tests/multinode/cluster.sh check "$cluster"
python3 - "$out" "$ppn" $nodes_list -- $rates <<'PYEOF'
import csv, os, sys
out, ppn = sys.argv[1], int(sys.argv[2])
i = sys.argv.index("--")
nodes, rates = [int(x) for x in sys.argv[3:i]], sys.argv[i + 1:]
def bits(rate):
    if rate == "off":
        return None
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f
    raise SystemExit(f"rate {rate}: use kbit, mbit or gbit")
rows = []
print(f"{'nodes':>5} {'ppn':>3} {'link':>7} {'MiB':>6} {'flat_ms':>9} {'hier_ms':>9} "
      f"{'hier/flat':>9} {'flat/bound':>10} {'hier/bound':>10}")
for n in nodes:
    for rate in rates:
        path = f"{out}/{n}-nodes-{rate}.sizes.csv"
        for r in csv.DictReader(open(path)):
            b = int(r["bytes"])
            flat, hier = float(r["raw_us"]) / 1e6, float(r["memtrain_us"]) / 1e6
            bps = bits(rate)
            bound = 2 * (n - 1) / n * b * 8 / bps if bps else None
            row = dict(nodes=n, ranks_per_node=ppn, link=rate, bytes=b, flat_s=flat,
                       hierarchical_s=hier, speedup=flat / hier,
                       flat_of_bound=bound / flat if bound else "",
                       hierarchical_of_bound=bound / hier if bound else "",
                       path=r["memtrain_path"])
            rows.append(row)
            fb = f"{bound / flat:10.2f}" if bound else f"{'-':>10}"
            hb = f"{bound / hier:10.2f}" if bound else f"{'-':>10}"
            print(f"{n:5d} {ppn:3d} {rate:>7} {b / 2**20:6.0f} {flat * 1e3:9.2f} {hier * 1e3:9.2f} "
                  f"{flat / hier:9.2f} {fb} {hb}")
with open(f"{out}/summary.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"# {out}/summary.csv; bound = 2(N-1)/N x bytes over the link rate (N nodes)")
PYEOF
