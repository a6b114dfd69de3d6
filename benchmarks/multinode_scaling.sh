#!/usr/bin/env bash
# memtrain's scaling across emulated nodes, against the scaling model for
# the same link: tests/multinode/cluster.sh makes NODES nodes on this
# machine (namespaces on a bridge, 198.18.0.0/15), and for each link RATE
# (tc tbf on every node's veth, both directions):
#   1. bench_scaling.py (weak scaling, K = --accum) at 1, 2, 4, ... nodes x
#      1 rank, mpirun through the cluster's hostfile;
#   2. bench_allreduce at 2, 4, ... nodes x 1 rank over the link, from half
#      to twice the model's gradient (step 1's): the all-reduce the model
#      is fitted to;
#   3. scaling_model.py predicts each multi-node point from the 1-node run
#      and that fit, and prints its error (target: within 15%).
# Then OUT/bench_scaling.png: efficiency against nodes, one curve per link
# speed (measured, solid) with the model's (dashed), at K = the first of
# --accum; OUT/summary.csv every point. Where the nodes outnumber the cores
# (4 nodes on 2), ranks share a CPU: bench_scaling reports the CPUs' load
# (cpu_load, the nodes counted as one machine) and the model stretches
# compute by it (scaling_model.py's docstring).
# Root only (namespaces, tc).
#
# usage: benchmarks/multinode_scaling.sh [--nodes 4] [--rates "1gbit 10gbit"]
#          [--accum 1,4,16] [--windows 8] [--rounds 3]
#          [--memtrain build/memtrain] [--bench build/benchmarks/bench_allreduce]
#          [--out runs/multinode_scaling] [-- bench_scaling.py options ...]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
max_nodes=4
rates="1gbit 10gbit"
accum=1,4,16
windows=8
rounds=3
memtrain=$repo/build/memtrain
bench=$repo/build/benchmarks/bench_allreduce
out=$repo/runs/multinode_scaling
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) max_nodes=$2 ;;
    --rates) rates=$2 ;;
    --accum) accum=$2 ;;
    --windows) windows=$2 ;;
    --rounds) rounds=$2 ;;
    --memtrain) memtrain=$2 ;;
    --bench) bench=$2 ;;
    --out) out=$2 ;;
    --) shift; break ;;
    *) sed -n '21,24p' "$0" >&2; exit 2 ;;
  esac
  shift 2
done
for exe in "$memtrain" "$bench"; do
  [ -x "$exe" ] || { echo "multinode_scaling.sh: $exe not built (bash launch/build.sh)" >&2; exit 2; }
done
ranks=1
n=1
while [ $((n * 2)) -le "$max_nodes" ]; do
  n=$((n * 2))
  ranks="$ranks,$n"
done
[ "$ranks" != 1 ] || { echo "multinode_scaling.sh: --nodes $max_nodes: at least 2" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
source launch/env.sh
cluster=$out/cluster
trap 'bash tests/multinode/cluster.sh down "$cluster"' EXIT
trap 'exit 130' INT TERM
bash tests/multinode/cluster.sh up "$cluster" "$max_nodes"
source "$cluster/cluster.env"
# Ranks one per node, node1 first: -np 1 runs on node1, -np 2 on node1 and
# node2, and so on. The output folders are on this machine's file system,
# which every node sees.
launch=$(printf '%q ' "${MPIEXEC:-mpirun}" "${MT_MPI_ARGS[@]}" --hostfile "$MT_HOSTFILE" --map-by node)
launch="$launch-np {n}"
for rate in $rates; do
  bash tests/multinode/cluster.sh shape "$cluster" "$rate"
  dir=$out/$rate
  mkdir -p "$dir"
  echo "# links $rate: bench_scaling at $ranks nodes x 1 rank" | tee "$dir/runs.txt"
  python3 benchmarks/bench_scaling.py --memtrain "$memtrain" --launch "$launch" \
    --ranks "$ranks" --modes weak --accum "$accum" --windows "$windows" --one-machine \
    --out "$dir" "$@" |
    tee "$dir/bench_scaling.txt"
  # The all-reduce is fitted around the model's gradient (bench_scaling's
  # CSV), from half to twice its size.
  grad=$(python3 -c 'import csv,sys; print(next(csv.DictReader(open(sys.argv[1])))["grad_bytes"])' \
    "$dir/bench_scaling.csv")
  fits=()
  for n in ${ranks//,/ }; do
    [ "$n" -gt 1 ] || continue
    echo "# links $rate: bench_allreduce at $n nodes x 1 rank, $((grad / 2)) to $((grad * 2)) bytes" |
      tee -a "$dir/runs.txt"
    head -n "$n" "$MT_HOSTFILE" >"$dir/hosts$n"
    "${MPIEXEC:-mpirun}" "${MT_MPI_ARGS[@]}" --hostfile "$dir/hosts$n" --map-by node -np "$n" \
      "$bench" --min-bytes $((grad / 2)) --max-bytes $((grad * 2)) --rounds "$rounds" \
      --models '' --csv "$dir/allreduce-$n" >"$dir/allreduce-$n.log" 2>&1 ||
      { tail -20 "$dir/allreduce-$n.log"; echo "multinode_scaling.sh: bench_allreduce failed ($rate, $n nodes)" >&2; exit 1; }
    fits+=(--allreduce-csv "$dir/allreduce-$n.sizes.csv")
  done
  python3 benchmarks/scaling_model.py --scaling-csv "$dir/bench_scaling.csv" "${fits[@]}" \
    --gpus 8 --out "$dir/model" >"$dir/model.txt"
  sed -n '/^# validation network/,/^# largest error/p' "$dir/model.txt" | tee -a "$dir/runs.txt"
done
bash tests/multinode/cluster.sh down "$cluster"
trap - EXIT
python3 - "$out" "${accum%%,*}" $rates <<'PYEOF'
import csv, os, sys
sys.path.insert(0, "benchmarks")
import gnuplot_png
out, k, rates = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
for rate in rates:
    for r in csv.DictReader(open(f"{out}/{rate}/model/validation.csv")):
        rows.append(dict(link=rate, **r))
keys = list(rows[0])
with open(f"{out}/summary.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
# One data file per link (CSV, as gnuplot_png reads): nodes, measured and
# predicted efficiency at K=k (1 node: 1 by definition).
lines = []
for i, rate in enumerate(rates):
    path = f"{out}/{rate}/efficiency-K{k}.dat"
    with open(path, "w") as f:
        f.write("1,1,1\n")
        for r in rows:
            if r["link"] == rate and r["accum"] == k and r["mode"] == "weak":
                f.write(f"{r['hosts']},{r['measured_efficiency']},{r['predicted_efficiency']}\n")
    lines.append(f"'{path}' using 1:2 with linespoints lw 2 lc {i + 1} pt 7 title '{rate} measured'")
    lines.append(f"'{path}' using 1:3 with linespoints lw 1 lc {i + 1} dt 2 pt 6 title '{rate} model'")
gnuplot_png.draw(f"{out}/bench_scaling.png",
                 "set logscale x 2\nset key bottom left\nset xlabel 'emulated nodes (1 rank each)'\n"
                 "set ylabel 'efficiency vs 1 node'\nset yrange [0:1.05]\n"
                 f"set title 'memtrain weak scaling across emulated nodes, K={k}'\n"
                 "plot " + ", ".join(lines) + "\n")
print(f"# {out}/summary.csv, {out}/bench_scaling.png")
PYEOF
bash tests/multinode/cluster.sh check "$cluster"
