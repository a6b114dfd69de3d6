#!/usr/bin/env bash
# memtrain across hosts, on this machine: tests/multinode/cluster.sh makes 4
# nodes (network, hostname and mount namespaces on a bridge, addresses from
# 198.18.0.0/15), and mpirun starts ranks on them through its launcher
# agent, MPI over TCP between them.
# 1. memtrain_mpi_tests' communicator tests at 2, 3 and 4 nodes x 2 ranks
#    (the hierarchical sum: shared memory within each node, the leaders'
#    ring over TCP) and 2 nodes x 1 rank (the flat MPI_Iallreduce): sums
#    equal MPI's exactly on integers and within 1e-6 relative on random
#    values, the same bits on every rank;
# 2. training at 2 nodes x 2 ranks ends with the weights of the same run on
#    one node (4 ranks) within 1e-6 relative, its window losses within
#    1e-6 relative; 2 nodes x 1 rank against 1 node x 2 ranks the same;
#    environment.json names each rank's host, node index, local rank and
#    local size, and the banner "2 nodes × 2 ranks"; the output folder is
#    the nodes' shared folder;
# 3. node-local copies of data.train that differ (each node's scratch
#    folder), and a node that runs another build (another GNU build id),
#    are refused before anything is written: exit 2, each host's ranks
#    named; equal copies train; a host that does not answer is named by
#    the launcher agent (as by ssh) and mpirun ends;
# 4. data.stage_dir: each node's own copies of the data in its scratch
#    folder, the weights of the shared-folder run to the bit; a stage
#    folder one node cannot write, or too small there, refused naming the
#    host before any node copies (exit 2, nothing written);
# 5. afterwards nothing of the cluster is left: no namespace, bridge, veth,
#    mount or process.
# usage: multinode.sh MEMTRAIN MPIEXEC PYTHON WORKDIR MPI_TESTS; exit 77
# (skipped, the reason printed) where namespaces cannot be made (not root).
set -uo pipefail
MEMTRAIN=$1
MPIEXEC=$2
PY=$3
WORK=$4
MPI_TESTS=$5
source "$(dirname "$0")/common.sh"
start_cluster 4
# Across NODES of the nodes with PER ranks on each (ranks 0..PER-1 on
# node1, and so on): across NODES PER COMMAND...
across() {
  local nodes=$1 per=$2
  shift 2
  head -n "$nodes" "$MT_HOSTFILE" >"hosts$nodes"
  "$MPIEXEC" "${MT_MPI_ARGS[@]}" --hostfile "hosts$nodes" --oversubscribe \
    --map-by "ppr:$per:node" -np $((nodes * per)) "$@"
}

# 1. The communicator tests across hosts: the leaders' ring at 2, 3 (its
#    segments uneven) and 4 nodes, the flat path with one rank per node.
for layout in "2 2 hierarchical" "3 2 hierarchical" "4 2 hierarchical" "2 1 flat"; do
  read -r nodes per path <<<"$layout"
  log=comm-$nodes-$per.log
  across "$nodes" "$per" "$MPI_TESTS" --gtest_filter='MpiCommunicator.*' >"$log" 2>&1 ||
    { tail -40 "$log"; fail "memtrain_mpi_tests MpiCommunicator.* at $nodes nodes x $per"; }
  grep -q "PASSED.*tests" "$log" || { tail -20 "$log"; fail "no gtest summary at $nodes nodes x $per"; }
  grep -q "$((nodes * per)) ranks, $path" "$log" ||
    { grep "ranks," "$log"; fail "$nodes nodes x $per: the sums did not take the $path path"; }
  echo "$nodes nodes x $per: MpiCommunicator tests passed;$(grep -o ' [0-9] ranks, .*' "$log" | head -1)"
done

# 2. Training across hosts against one node.
"$MEMTRAIN" make-data --kind features --out "$S/train.h5" --samples 512 --features 64 --classes 4 >/dev/null || fail make-data
"$MEMTRAIN" make-data --kind features --out "$S/val.h5" --samples 64 --features 64 --classes 4 --split val >/dev/null || fail make-data
cat >"$S/cfg.yaml" <<EOF
data:
  train: $S/train.h5
  val: $S/val.h5
  batch_size: 16
model:
  hidden: 128
training:
  epochs: 2
  gradient_accumulation_steps: 2
EOF
train() {  # OUT then the launcher's words
  local out=$1
  shift
  "$@" "$MEMTRAIN" train --config "$S/cfg.yaml" --output.dir="$S/$out" >"$out.log" 2>&1 ||
    { tail -30 "$out.log"; fail "run $out"; }
}
train one4 "$MPIEXEC" --oversubscribe -np 4
train two2 across 2 2
train one2 "$MPIEXEC" --oversubscribe -np 2
train two1 across 2 1
grep -q "^memtrain 0.1.0: 4 rank(s) on 2 nodes × 2 ranks," two2.log || { head -5 two2.log; fail "2x2 banner"; }
grep -q "^memtrain 0.1.0: 2 rank(s) on 2 nodes × 1 rank," two1.log || { head -5 two1.log; fail "2x1 banner"; }
grep -q "^memtrain 0.1.0: 4 rank(s) on 1 node × 4 ranks," one4.log || { head -5 one4.log; fail "1x4 banner"; }
"$PY" - "$S" "$REPO/tests/tools" "$REPO/tests/peers" <<'PYEOF' || fail "weights, losses or environment.json"
import json, sys
sys.path[:0] = sys.argv[2:4]
import check_metrics
import safetensors_read
S = sys.argv[1]

def windows(d):
    return [(w["step"], w["loss"]) for w in check_metrics.records(f"{S}/{d}")[0]]

for one, two, shape in (("one4", "two2", (2, 2)), ("one2", "two1", (2, 1))):
    a, _ = safetensors_read.load(f"{S}/{one}/model.safetensors")
    b, _ = safetensors_read.load(f"{S}/{two}/model.safetensors")
    worst = safetensors_read.max_relative_diff(a, b)
    assert worst <= 1e-6, (two, worst)
    la, lb = windows(one), windows(two)
    assert [s for s, _ in la] == [s for s, _ in lb] and len(la) > 4, (len(la), len(lb))
    loss = max(abs(x - y) / abs(x) for (_, x), (_, y) in zip(la, lb))
    assert loss <= 1e-6, (two, loss)
    same = sum(x == y for (_, x), (_, y) in zip(la, lb))
    e = json.load(open(f"{S}/{two}/environment.json"))
    nodes, per = shape
    assert e["nodes"]["count"] == nodes and e["nodes"]["ranks_per_node"] == [per] * nodes, e["nodes"]
    ranks = e["ranks"]
    want = [(f"node{r // per + 1}", r // per, r % per, per) for r in range(nodes * per)]
    got = [(x["host"], x["node_index"], x["local_rank"], x["local_size"]) for x in ranks]
    assert got == want, got
    print(f"{nodes} nodes x {per}: {len(lb)} windows, weights within {worst:.2g} relative of "
          f"1 node x {nodes * per}, losses within {loss:.2g} ({same} of {len(lb)} equal); "
          f"ranks on {[g[0] for g in got]}")
PYEOF

# 3. Refused across nodes, before anything is written (exit 2, one line
#    naming each host's ranks): node-local copies of data.train that
#    differ, and a node that runs another build of memtrain.
for k in 1 2; do cp "$S/train.h5" "$C/nodes/node$k/scratch/train.h5"; done
"$MEMTRAIN" make-data --kind features --out "$C/nodes/node2/scratch/train.h5" --samples 512 \
  --features 64 --classes 4 --seed 7 >/dev/null || fail make-data
refused() {  # NAME PATTERN then overrides: across 2 nodes x 1, exit 2
  local name=$1 pattern=$2 rc=0
  shift 2
  across 2 1 "$MEMTRAIN" train --config "$S/cfg.yaml" --output.dir="$S/$name" "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { tail -20 "$name.log"; fail "$name: exit $rc, not 2"; }
  grep -q "$pattern" "$name.log" || { grep error "$name.log"; fail "$name: no line '$pattern'"; }
  [ ! -e "$S/$name" ] || fail "$name: output.dir was written: $(ls "$S/$name")"
  grep -o "memtrain: error: .*" "$name.log" | head -1 | cut -c1-400
}
refused data "data.train '$MT_SCRATCH/train.h5': the ranks read different files: rank 0 on node1 read .* bytes, digest [0-9a-f]*; rank 1 on node2 read .* bytes, digest [0-9a-f]*\. Put one copy" \
  --data.train="$MT_SCRATCH/train.h5" --training.max_windows=2
cp "$S/train.h5" "$C/nodes/node2/scratch/train.h5"
across 2 1 "$MEMTRAIN" train --config "$S/cfg.yaml" --output.dir="$S/same" --data.train="$MT_SCRATCH/train.h5" \
  --training.max_windows=2 >same.log 2>&1 || { tail -20 same.log; fail "equal node-local copies of data.train"; }
echo "equal node-local copies of data.train: trained"
# Another build on node2: this memtrain with one byte of its GNU build id
# changed, mounted over the executable in node2's mount namespace alone.
id=$(readelf -n "$MEMTRAIN" | awk '/Build ID/ {print $3}')
[ -n "$id" ] || fail "no GNU build id in $MEMTRAIN"
"$PY" - "$MEMTRAIN" "$C/nodes/other-memtrain" "$id" <<'PYEOF' || fail "could not make another build"
import sys
blob = bytearray(open(sys.argv[1], "rb").read())
at = blob.find(bytes.fromhex(sys.argv[3]))
assert at > 0
blob[at] ^= 0xff
open(sys.argv[2], "wb").write(blob)
PYEOF
chmod +x "$C/nodes/other-memtrain"
bash "$C/cluster.sh" exec "$C" node2 mount --bind "$C/nodes/other-memtrain" "$MEMTRAIN"
refused build "the ranks run different builds of memtrain: rank 0 on node1 run memtrain 0.1.0, build id $id; rank 1 on node2 run memtrain 0.1.0, build id [0-9a-f]*\. Install the same memtrain" \
  --training.max_windows=2
bash "$C/cluster.sh" exec "$C" node2 umount "$MEMTRAIN"
# A host in the hostfile that does not answer (node2 cut off): the launcher
# agent, as ssh would, names it; mpirun ends, memtrain never starts.
bash "$C/cluster.sh" link "$C" node2 down
rc=0
start=$SECONDS
timeout 120 "$MPIEXEC" "${MT_MPI_ARGS[@]}" --hostfile hosts2 --oversubscribe --map-by ppr:1:node -np 2 \
  "$MEMTRAIN" train --config "$S/cfg.yaml" --output.dir="$S/nohost" >nohost.log 2>&1 || rc=$?
bash "$C/cluster.sh" link "$C" node2 up
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { tail -20 nohost.log; fail "a host that does not answer: mpirun exit $rc"; }
grep -q "connect to host node2 (.*) port 22: no answer" nohost.log || { cat nohost.log; fail "node2 not named"; }
[ ! -e "$S/nohost" ] || fail "a host that does not answer: output.dir was written"
echo "a host that does not answer: mpirun ended after $((SECONDS - start)) s, status $rc: $(grep -o 'agent: .*' nohost.log)"

# 4. data.stage_dir: each node copies data.train and data.val into its own
#    scratch folder (two ranks a node: a stripe each) and trains from there
#    to the bits of the run that read the shared copies; a later run finds
#    the copies. Refused, before any node copies and with nothing written
#    (exit 2, the host named): a stage folder node2 cannot write (its
#    scratch read-only there), one with too little space (a 64 KiB tmpfs).
staged() {  # NAME: 2 nodes x 2 ranks with data.stage_dir=$MT_SCRATCH/stage
  across 2 2 "$MEMTRAIN" train --config "$S/cfg.yaml" --output.dir="$S/$1" \
    --data.stage_dir="$MT_SCRATCH/stage" >"$1.log" 2>&1 || { tail -30 "$1.log"; fail "run $1"; }
}
staged staged
grep -q "^data.stage_dir: data.train '$S/train.h5' copied to '$MT_SCRATCH/stage/train\.[0-9a-f]*\.h5' on 2 of 2 node(s) (" staged.log ||
  { grep -i stage staged.log; fail "no line for the copy of data.train"; }
for k in 1 2; do
  for f in train val; do
    cmp -s "$S/$f.h5" "$C/nodes/node$k/scratch/stage/$f".*.h5 || fail "node$k's copy of $f.h5 differs"
  done
  ! ls "$C/nodes/node$k/scratch/stage" | grep -q tmp || fail "node$k: a partial copy left"
done
cmp -s "$S/two2/model.safetensors" "$S/staged/model.safetensors" || fail "staged data: other weights than two2's"
staged staged_again
grep -q "^data.stage_dir: data.train '$S/train.h5' found as '$MT_SCRATCH/stage/train\.[0-9a-f]*\.h5' on every node (2; " staged_again.log ||
  { grep -i stage staged_again.log; fail "the second run did not find the copies"; }
echo "data.stage_dir: copied on each node, the weights of the shared-folder run to the bit; found by the next run"
bash "$C/cluster.sh" exec "$C" node2 mount -o remount,bind,ro "$MT_SCRATCH"
refused stage_ro "data.stage_dir '$MT_SCRATCH/stage2' cannot be written on node2: no file can be made in '$MT_SCRATCH' (where '$MT_SCRATCH/stage2' would be made): Read-only file system\. Give data.stage_dir a folder" \
  --data.stage_dir="$MT_SCRATCH/stage2"
bash "$C/cluster.sh" exec "$C" node2 mount -o remount,bind,rw "$MT_SCRATCH"
[ ! -e "$C/nodes/node1/scratch/stage2" ] || fail "a refused stage folder was made on node1"
bash "$C/cluster.sh" exec "$C" node2 mount -t tmpfs -o size=64k tmpfs "$MT_SCRATCH"
refused stage_full "data.stage_dir '$MT_SCRATCH/stage3' on node2 has 64.0 KiB free; the copies of the data need .*\. Free space there" \
  --data.stage_dir="$MT_SCRATCH/stage3"
bash "$C/cluster.sh" exec "$C" node2 umount "$MT_SCRATCH"
[ ! -e "$C/nodes/node1/scratch/stage3" ] || fail "a refused stage folder was made on node1"

# 5. Nothing left behind.
stop_cluster
echo "PASS multinode"
