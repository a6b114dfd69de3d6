#!/usr/bin/env bash
# memtrain's SLURM scripts across hosts: tests/slurm/cluster.sh start DIR 2
# makes a 2-node SLURM (node1 and node2: network, hostname and mount
# namespaces of tests/multinode/cluster.sh, one slurmd in each, slurmctld
# on their bridge; addresses from 198.18.0.0/15).
# 1. sbatch -N 2 --ntasks-per-node=2 launch/slurm/train.sbatch trains
#    through srun --mpi=pmix across the nodes: environment.json names the
#    launcher slurm, every rank's host, node index, local rank (SLURM's
#    block layout: 0,1 on node1, 0,1 on node2) and local size 2; the
#    banner says "2 nodes × 2 ranks"; the weights equal, bit for bit, the
#    same run started by mpirun across the same two nodes (both sum
#    hierarchically, in the same order);
# 2. SLURM_TASKS_PER_NODE=3,1 (4 tasks placed 3 and 1 by an arbitrary
#    distribution): each rank's local size is its node's count (3,3,3,1),
#    and the run trains; the banner says "2 nodes: 3+1 ranks";
# 3. node2 cut off during a 2 x 2 job (its link down: a partition, no
#    process dies): rank 0 names ranks 2, 3 on node2, srun ends the step
#    (--wait: MEMTRAIN_STEP_WAIT_S after the first rank exited, while
#    SLURM has not marked node2 down), node2 does not answer train.sbatch's probe,
#    and the job continues on node1 at world size 2 from the newest
#    checkpoint; the link comes back and the job completes there: its
#    window losses equal an uninterrupted run's within 1e-5 relative, its
#    newest checkpoint exports whole, node2's ranks ended on their own
#    timeout and nothing of the job is left on either node;
# 4. node2 crashes during a 2 x 2 job (every process on it killed, slurmd
#    too): rank 0 names ranks 2, 3 on node2, train.sbatch finds node2
#    gone and continues the job on node1 at world size 2 from the newest
#    checkpoint (--no-kill keeps the allocation); USR1 there (the time
#    limit's warning): memtrain checkpoints, train.sbatch does not requeue
#    (the job could not start again) and says how to submit it again;
#    submitted so, it resumes and completes: its window losses equal an
#    uninterrupted run's within 1e-5 relative, its newest checkpoint
#    exports whole, and no process of it is left on either node;
# 5. the daemons and the nodes are gone afterwards.
# usage: multinode.sh MEMTRAIN MPIEXEC PYTHON WORKDIR; exit 77 (skipped)
# where SLURM or namespaces cannot run (not root).
set -uo pipefail
MEMTRAIN=$1
MPIEXEC=$2
PY=$3
WORK=$4
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
fail() {
  echo "FAIL: $*"
  exit 1
}
[ -d "$WORK/cluster" ] && "$HERE/cluster.sh" stop "$WORK/cluster"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
source "$REPO/launch/env.sh"

rc=0
"$HERE/cluster.sh" start cluster 2 >start.log 2>&1 || rc=$?
[ "$rc" = 77 ] && { cat start.log; exit 77; }
trap '"$HERE/cluster.sh" stop "$WORK/cluster"' EXIT
trap 'exit 130' INT TERM
[ "$rc" = 0 ] || { cat start.log; fail "cluster.sh start: exit $rc"; }
export SLURM_CONF=$WORK/cluster/slurm.conf
source cluster/net/cluster.env
S=$MT_SHARED
echo "SLURM $(sinfo --version | awk '{print $2}'): $(sinfo -h -N -o '%N %c CPUs %T' | tr '\n' ' ')"

"$MEMTRAIN" make-data --kind features --out "$S/train.h5" --samples 256 --features 64 --classes 4 >/dev/null || fail make-data
cat >"$S/cfg.yaml" <<EOF
data:
  train: $S/train.h5
  val: ""
  batch_size: 16
model:
  hidden: 128
training:
  epochs: 2
EOF
# A rank that crashed inside MPI_Init: Open MPI 4.1.4 under srun across
# these nodes, about 1 launch in 25 (ARCHITECTURE.md, "Several nodes"):
# a segmentation fault before any rank printed memtrain's banner. A test
# launch that ends so is run once more, and says so.
init_crash() {  # LOG
  grep -q "Segmentation fault" "$1" && ! grep -q "^memtrain 0.1.0: " "$1" &&
    echo "($1: a rank crashed inside MPI_Init, Open MPI's start-up crash: launched once more)"
}
submit() {  # NAME then sbatch options; waits; the job's log is NAME-<id>.out
  local name=$1
  shift
  local out rc try
  for try in 1 2; do
    out=$(timeout 240 sbatch --wait "$@" --cpus-per-task=1 --gpus-per-node=0 --time=5 \
      --output="$S/$name-%j.out" \
      --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN" \
      "$REPO/launch/slurm/train.sbatch" "$S/cfg.yaml" --output.dir="$S/$name" 2>&1)
    rc=$?
    job=$(echo "$out" | awk '/Submitted batch job/ {print $4}')
    [ "$try" = 1 ] && [ "$rc" != 0 ] && init_crash "$S/$name-$job.out" && rm -rf "${S:?}/$name" && continue
    break
  done
  [ "$rc" = 0 ] || { echo "$out"; squeue; tail -n 30 "$S/$name"-*.out; fail "$name: sbatch exit $rc (124: not finished in 240 s)"; }
  grep -q "^done: $S/$name/model.safetensors" "$S/$name-$job.out" ||
    { tail -n 20 "$S/$name-$job.out"; fail "$name: no finished run"; }
}

# 1. 2 nodes x 2 tasks, and the same run under mpirun across the nodes.
submit sb22 -N 2 --ntasks-per-node=2
grep -q "^memtrain 0.1.0: 4 rank(s) on 2 nodes × 2 ranks, backend mpi, local rank from slurm" "$S/sb22-$job.out" ||
  { head -8 "$S/sb22-$job.out"; fail "sb22: banner"; }
"$MPIEXEC" "${MT_MPI_ARGS[@]}" --hostfile "$MT_HOSTFILE" --oversubscribe --map-by ppr:2:node -np 4 "$MEMTRAIN" train \
  --config "$S/cfg.yaml" --output.dir="$S/mp22" >mp22.log 2>&1 || { tail -n 20 mp22.log; fail "mpirun across the nodes"; }
cmp "$S/sb22/model.safetensors" "$S/mp22/model.safetensors" ||
  fail "srun's and mpirun's weights across 2 nodes differ"
"$PY" - "$S/sb22/environment.json" "$job" <<'PYEOF' || fail "sb22: environment.json"
import json, sys
e = json.load(open(sys.argv[1]))
assert e["launcher"] == "slurm" and e["slurm"]["job_id"] == sys.argv[2], (e["launcher"], e["slurm"])
assert e["nodes"] == {"count": 2, "ranks_per_node": [2, 2], "layout": "2 nodes × 2 ranks"}, e["nodes"]
got = [(r["host"], r["node_index"], r["local_rank"], r["local_size"]) for r in e["ranks"]]
assert got == [("node1", 0, 0, 2), ("node1", 0, 1, 2), ("node2", 1, 0, 2), ("node2", 1, 1, 2)], got
print(f"sbatch -N 2 --ntasks-per-node=2: job {sys.argv[2]}, ranks {got}; weights = mpirun's across the nodes")
PYEOF

# 2. 3 tasks on node1 and 1 on node2: an arbitrary distribution from a
#    host list, more tasks than the node's 2 CPUs (-O), srun as train.sbatch
#    runs it (train.sbatch's own --ntasks-per-node=4 cannot be lifted from
#    the command line, and SLURM refuses it with this layout).
printf 'node1\nnode1\nnode1\nnode2\n' >"$S/hosts31"
for try in 1 2; do
  rc=0
  SLURM_HOSTFILE=$S/hosts31 timeout 240 sbatch --wait -O -N 2 -n 4 --distribution=arbitrary \
    --time=5 --output="$S/sb31.out" --open-mode=truncate \
    --wrap "srun --mpi=pmix $MEMTRAIN train --config $S/cfg.yaml --output.dir=$S/sb31" >sb31.txt 2>&1 || rc=$?
  [ "$try" = 1 ] && [ "$rc" != 0 ] && init_crash "$S/sb31.out" && rm -rf "${S:?}/sb31" && continue
  [ "$rc" = 0 ] || { cat sb31.txt; tail -n 20 "$S/sb31.out"; fail "sb31: sbatch"; }
  break
done
grep -q "^memtrain 0.1.0: 4 rank(s) on 2 nodes: 3+1 ranks" "$S/sb31.out" ||
  { head -8 "$S/sb31.out"; fail "sb31: banner"; }
"$PY" - "$S/sb31/environment.json" <<'PYEOF' || fail "sb31: environment.json"
import json, sys
e = json.load(open(sys.argv[1]))
assert e["nodes"]["ranks_per_node"] == [3, 1], e["nodes"]
got = [(r["host"], r["local_rank"], r["local_size"]) for r in e["ranks"]]
assert got == [("node1", 0, 3), ("node1", 1, 3), ("node1", 2, 3), ("node2", 0, 1)], got
print(f"SLURM_TASKS_PER_NODE=3,1: ranks {got}")
PYEOF

# A 2 x 2 job of lost_run_setup's run into $S/NAME (its log NAME.out),
# in the background (its sbatch: $sb, its id: $job), once it has written
# its checkpoint at step 32.
source "$REPO/tests/multinode/lost_run.sh"
mkdir -p "$S/nl"
lost_run_setup "$S/nl"
start_lost_job() {  # NAME
  local name=$1 try waited
  for try in 1 2; do
    timeout 300 sbatch --wait -N 2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=5 \
      --output="$S/$name.out" --open-mode=truncate \
      --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN",MEMTRAIN_NODE_PROBE_S=20,MEMTRAIN_STEP_WAIT_S=5 \
      "$REPO/launch/slurm/train.sbatch" "$S/nl/cfg.yaml" --output.dir="$S/$name" >"$name.txt" 2>&1 &
    sb=$!
    waited=0
    until ls "$S/$name/checkpoints/" 2>/dev/null | grep -q 'ckpt-000000\([3-9][0-9]\|[1-9][0-9][0-9]\)\.'; do
      kill -0 $sb 2>/dev/null || break
      sleep 0.1
      waited=$((waited + 1))
      [ $waited -lt 1200 ] || fail "$name: no checkpoint at step 32 after 120 s"
    done
    kill -0 $sb 2>/dev/null && break
    [ "$try" = 1 ] && init_crash "$S/$name.out" && rm -rf "${S:?}/$name" && continue
    cat "$name.txt"
    tail -20 "$S/$name.out"
    fail "$name: the job ended before its checkpoint at step 32"
  done
  job=$(awk '/Submitted batch job/ {print $4}' "$name.txt")
}
# The job continues on node1: rank 0 named ranks 2, 3 on node2 and
# train.sbatch continued the job there (NAME's log).
continued_on_node1() {  # NAME
  local out=$S/$1.out
  grep -h "error:.*did not arrive\|^train.sbatch:\|^resumed from" "$out"
  grep -q "^memtrain: \[rank 0, node1\] error: .*ranks 2, 3 on node2 did not arrive" "$out" ||
    fail "$1: rank 0 did not name ranks 2, 3 on node2"
  grep -q "^train.sbatch: node(s) node2 did not answer after memtrain stopped (status [0-9]*): job $job continues on node1 with 2 ranks" "$out" ||
    fail "$1: train.sbatch did not continue on node1"
  grep -q "on 1 node × 2 ranks" "$out" || fail "$1: no 1 node x 2 ranks run after the loss"
  grep -q "^resumed from $S/$1/checkpoints/ckpt-" "$out" || fail "$1: the run on node1 did not resume"
}
# NAME's window losses against the uninterrupted run's.
same_as_full() {  # NAME
  "$PY" - "$S" "$REPO/tests/tools" "$1" <<'PYEOF' || fail "$1: the continued run's losses"
import sys
sys.path.insert(0, sys.argv[2])
import check_metrics
worst = check_metrics.same_losses(f"{sys.argv[1]}/nl/full", f"{sys.argv[1]}/{sys.argv[3]}", 256, 1e-5)
print(f"{sys.argv[3]}: 256 windows, losses within {worst:.2g} relative of the uninterrupted run")
PYEOF
}
# NAME's sbatch output and the end of its job's log, then fail with WHY.
job_fail() {  # NAME WHY
  cat "$1.txt"
  grep -v '"type"' "$S/$1.out" | tail -30
  fail "$1: $2"
}
# Until NAME's job resumed on node1 (within 180 s of t0), saying so after WHAT.
until_resumed() {  # NAME WHAT
  until grep -q "^resumed from" "$S/$1.out" 2>/dev/null; do
    kill -0 $sb 2>/dev/null || job_fail "$1" "the job ended before it continued on node1"
    [ $(($(date +%s) - t0)) -lt 180 ] || fail "$1: the job did not continue on node1 within 180 s"
    sleep 0.1
  done
  echo "$1: the job continued on node1 $(($(date +%s) - t0)) s after $2"
}
# NAME's job (sbatch $sb) ends with status RC.
job_ends_with() {  # NAME RC [WHY]
  local rc=0
  wait $sb || rc=$?
  [ "$rc" = "$2" ] || job_fail "$1" "the job ended with $rc, not $2${3:+ ($3)}"
}
# Until the SLURM nodes are STATE (a regular expression), at most 120 s.
wait_nodes() {
  local _ states
  for _ in $(seq 240); do
    states=$(sinfo -h -N -o %T)
    [ -n "$states" ] && [ -z "$(grep -Ev "^($1)$" <<<"$states")" ] && return 0
    sleep 0.5
  done
  sinfo -N
  fail "the nodes did not become $1 within 120 s"
}

# 3. node2 cut off; the job continues on node1, the link comes back.
start_lost_job cut
t0=$(date +%s)
bash "$MT_CLUSTER/cluster.sh" link "$MT_CLUSTER" node2 down
until_resumed cut "node2's link went down"
bash "$MT_CLUSTER/cluster.sh" link "$MT_CLUSTER" node2 up
job_ends_with cut 0
continued_on_node1 cut
grep -q "^srun: First task exited [0-9]*s ago" "$S/cut.out" ||
  fail "cut: srun did not end the step by its --wait"
grep -q "^done: $S/cut/model.safetensors" "$S/cut.out" || fail "cut: the job did not complete on node1"
same_as_full cut
newest_whole "$S/cut"
none_left node1 "^slurmd "
none_left node2 "^slurmd "
echo "cut: nothing of the job left on node1 or node2"
wait_nodes idle

# 4. node2 crashes; the job continues on node1.
start_lost_job lost
t0=$(date +%s)
bash "$MT_CLUSTER/cluster.sh" kill "$MT_CLUSTER" node2
# Once the job runs on node1 alone, SLURM's warning before its time limit
# (USR1): memtrain checkpoints and exits 3, and train.sbatch does not
# requeue a job that lost a node (it could never start again) but says how
# to submit it again.
until_resumed lost "node2 was killed"
scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 $job"
job_ends_with lost 3 "USR1 after the loss"
continued_on_node1 lost
grep -q "^train.sbatch: memtrain stopped at a checkpoint (status 3) after this job lost a node: not requeued .*sbatch -N 1 --ntasks-per-node=2 $REPO/launch/slurm/train.sbatch $S/nl/cfg.yaml --output.dir=$S/lost$" "$S/lost.out" ||
  fail "lost: no line saying the job is not requeued and how to submit it again"
# Submitted again as that line says: it resumes and completes on node1.
timeout 240 sbatch --wait -N 1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=5 \
  --output="$S/again.out" --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN" \
  "$REPO/launch/slurm/train.sbatch" "$S/nl/cfg.yaml" --output.dir="$S/lost" >again.txt 2>&1 ||
  { cat again.txt; tail -20 "$S/again.out"; fail "lost: the job submitted again did not complete"; }
grep -h "^resumed from" "$S/again.out" || fail "lost: the job submitted again did not resume"
same_as_full lost
newest_whole "$S/lost"
none_left node1 "^slurmd "
none_left node2 "^slurmd "
echo "lost: nothing of the job left on node1 or node2"

# 5. Daemons and nodes gone.
pids=$(cat cluster/*.pid)
"$HERE/cluster.sh" stop "$WORK/cluster"
trap - EXIT
for p in $pids; do
  ! kill -0 "$p" 2>/dev/null || fail "daemon $p still running after stop"
done
bash "$REPO/tests/multinode/cluster.sh" check cluster/net || fail "the nodes were not removed"
echo "PASS slurm_multinode"
