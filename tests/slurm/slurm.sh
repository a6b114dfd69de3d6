#!/usr/bin/env bash
# memtrain's SLURM scripts against a real SLURM (tests/slurm/cluster.sh: a
# one-node cluster of Debian's slurmctld and slurmd on this host, as root):
# 1. sbatch launch/slurm/train.sbatch trains 2 ranks to completion: srun
#    --mpi=pmix starts them (no mpirun), memtrain reads its world from
#    SLURM (launcher "slurm"), environment.json names the job, both ranks
#    and their cores (one each, different), and the weights equal an mpirun
#    run's of the same config bit for bit;
# 2. the time limit: SLURM itself sends train.sbatch's --signal=USR1@120
#    (its own #SBATCH line) when the running job's limit comes within
#    reach (scontrol update TimeLimit); the ranks checkpoint at a window
#    boundary and exit 3, train.sbatch requeues the job, SLURM starts it
#    again, it resumes with --resume auto and ends with an uninterrupted
#    mpirun run's weights bit for bit and its window losses record for
#    record; the job's log (--open-mode=append) holds both attempts and
#    environment.json its restart count (scancel --signal=USR1, a user's
#    or a preemption script's signal, takes the same path in
#    multinode.sh);
# 3. a rank SIGKILLed under srun ends the job within a minute (no hang),
#    and the last checkpoint on disk resumes under mpirun;
# 4. sbatch launch/slurm/scaling.sbatch runs bench_scaling.py through srun
#    at its smallest size and writes its CSV and plot;
# 5. the daemons the test started are gone afterwards.
# usage: slurm.sh MEMTRAIN MPIEXEC PYTHON WORKDIR; exit 77 (skipped) where
# SLURM cannot run (not root).
set -uo pipefail
MEMTRAIN=$1
MPIEXEC=$2
PY=$3
WORK=$4
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# Daemons a killed earlier run of this test left behind: stopped first.
[ -d "$WORK/cluster" ] && "$HERE/cluster.sh" stop "$WORK/cluster"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
source "$REPO/launch/env.sh"

rc=0
"$HERE/cluster.sh" start cluster >start.log 2>&1 || rc=$?
[ "$rc" = 77 ] && { cat start.log; exit 77; }
trap '"$HERE/cluster.sh" stop "$WORK/cluster"' EXIT
[ "$rc" = 0 ] || { cat start.log; fail "cluster.sh start: exit $rc"; }
export SLURM_CONF=$WORK/cluster/slurm.conf
echo "SLURM $(sinfo --version | awk '{print $2}'): $(sinfo -h -o '%P %D node(s) %c CPUs %T')"

"$MEMTRAIN" make-data --kind features --out train.h5 --samples 256 >/dev/null || fail make-data
"$MEMTRAIN" make-data --kind features --out val.h5 --samples 64 --split val >/dev/null || fail make-data
cat >cfg.yaml <<EOF
data:
  train: $WORK/train.h5
  val: $WORK/val.h5
training:
  epochs: 2
output:
  dir: $WORK/sb
EOF

# 1. train.sbatch: 2 tasks of 1 CPU, no GPU (this node has none).
out=$(timeout 240 sbatch --wait --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
  --time=5 --output="$WORK/train-%j.out" \
  --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN" \
  "$REPO/launch/slurm/train.sbatch" "$WORK/cfg.yaml" 2>&1)
rc=$?
job=$(echo "$out" | awk '/Submitted batch job/ {print $4}')
[ "$rc" = 0 ] || { echo "$out"; squeue; cat train-*.out 2>/dev/null | tail -20; fail "train.sbatch: exit $rc (124: not finished in 240 s)"; }
grep -q "^done: $WORK/sb/model.safetensors" "train-$job.out" ||
  { tail -20 "train-$job.out"; fail "train.sbatch: no finished run in train-$job.out"; }
"$PY" - sb/environment.json "$job" <<'PYEOF' || fail "environment.json"
import json, sys
e = json.load(open(sys.argv[1]))
assert e["launcher"] == "slurm", e["launcher"]
assert e["world_size"] == 2, e["world_size"]
assert e["slurm"]["job_id"] == sys.argv[2], e["slurm"]
cpus = [r["cpus"] for r in e["ranks"]]
assert [r["rank"] for r in e["ranks"]] == [0, 1] and len(set(cpus)) == 2, cpus
print(f"train.sbatch: job {e['slurm']['job_id']}, 2 ranks on CPUs {cpus}, launcher slurm")
PYEOF
# The same run under mpirun: the same weights, bit for bit.
"$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --config cfg.yaml \
  --output.dir="$WORK/mp" >mp.log 2>&1 || { tail -20 mp.log; fail "mpirun run"; }
cmp sb/model.safetensors mp/model.safetensors || fail "srun's and mpirun's weights differ"
echo "train.sbatch: model.safetensors equals mpirun's"

# 2. The time limit, and the requeue. SLURM sends the --signal warning
#    from its periodic check (every 30 s: slurmctld's PERIODIC_TIMEOUT) once
#    the limit is less than the warning plus 30 s away. So that a fast
#    machine does not finish the run before that check, the ranks are
#    stopped (SIGSTOP) once it is going, the job's limit is brought within
#    reach (scontrol update TimeLimit=2), and SLURM's signal wakes them
#    (slurmstepd sends SIGCONT with it: they checkpoint and exit); the
#    test wakes any in which the USR1 is only pending (/proc/PID/status
#    ShdPnd: signal 10, the mask's 0x200).
"$MEMTRAIN" make-data --kind features --out big.h5 --samples 16384 >/dev/null || fail make-data
cat >pre.yaml <<EOF
data:
  train: $WORK/big.h5
  val: ""
model:
  hidden: 128
training:
  epochs: 3
output:
  dir: $WORK/pre
  progress_every_s: 1000
EOF
"$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --config pre.yaml \
  --output.dir="$WORK/full" >full.log 2>&1 || { tail -20 full.log; fail "uninterrupted run"; }
timeout 300 sbatch --wait --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
  --time=30 --output="$WORK/pre-%j.out" \
  --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN" \
  "$REPO/launch/slurm/train.sbatch" "$WORK/pre.yaml" >pre-sbatch.txt 2>&1 &
waiter=$!
for _ in $(seq 600); do
  [ -f pre/metrics.jsonl ] && [ "$(wc -l <pre/metrics.jsonl)" -ge 100 ] && break
  sleep 0.1
done
job=$(awk '/Submitted batch job/ {print $4}' pre-sbatch.txt)
[ -n "$job" ] || { cat pre-sbatch.txt; fail "time limit: no job id"; }
ranks=$(pgrep -f "^$MEMTRAIN train --config $WORK/pre.yaml")  # not srun's
[ "$(echo $ranks | wc -w)" = 2 ] || fail "time limit: want 2 rank processes, found: $ranks"
kill -STOP $ranks
scontrol update JobId="$job" TimeLimit=2 || { kill -CONT $ranks; fail "scontrol update JobId=$job TimeLimit=2"; }
updated=$SECONDS
usr1_reached() {  # PID: gone (woken by SLURM), or SIGUSR1 (10) pending
  local m
  m=$(awk '/^ShdPnd:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 0
  [ -n "$m" ] && (( (16#$m >> 9) & 1 ))
}
for _ in $(seq 450); do
  all=1
  for p in $ranks; do usr1_reached "$p" || all=0; done
  [ "$all" = 1 ] && break
  sleep 0.1
done
warned=$((SECONDS - updated))
kill -CONT $ranks 2>/dev/null
[ "$all" = 1 ] || fail "time limit: SLURM sent no USR1 within 45 s of TimeLimit=2 (train.sbatch: --signal=USR1@120)"
# Requeued, the job gets its 30 minutes back before it starts again
# (SLURM holds it 30 s: cred_expire, cluster.sh), so that the resumed leg
# is not warned at once too.
for _ in $(seq 600); do
  grep -q "requeueing job $job" "pre-$job.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "requeueing job $job" "pre-$job.out" ||
  { tail -30 "pre-$job.out"; fail "time limit: the job was not requeued within 60 s of SLURM's USR1"; }
scontrol update JobId="$job" TimeLimit=30 || fail "scontrol update JobId=$job TimeLimit=30 (requeued)"
rc=0
wait "$waiter" || rc=$?
[ "$rc" = 0 ] || { cat pre-sbatch.txt; squeue; tail -30 "pre-$job.out"; fail "job warned of its time limit: exit $rc"; }
grep -q "stop requested (SIGTERM, SIGUSR1 or SIGINT on a rank): checkpoint written" "pre-$job.out" ||
  { tail -30 "pre-$job.out"; fail "time limit: no checkpoint on SLURM's signal in pre-$job.out"; }
[ "$(grep -c '^memtrain 0.1.0:' "pre-$job.out")" = 2 ] ||
  { tail -30 "pre-$job.out"; fail "time limit: want 2 attempts in pre-$job.out (--open-mode=append)"; }
cmp pre/model.safetensors full/model.safetensors ||
  fail "the run requeued at its time limit ends with weights that differ from the uninterrupted run's"
"$PY" - "$job" "$warned" <<'PYEOF' || fail "time-limit records"
import json, sys
def windows(d):
    return [(j["step"], j["loss"]) for j in map(json.loads, open(d + "/metrics.jsonl"))
            if j["type"] == "window"]
a, b = windows("full"), windows("pre")
assert a == b, next(((x, y) for x, y in zip(a, b) if x != y), (len(a), len(b)))
e = json.load(open("pre/environment.json"))
assert e["slurm"]["job_id"] == sys.argv[1] and e["slurm"]["restart_count"] == "1", e["slurm"]
print(f"time limit: job {sys.argv[1]} warned by SLURM (its USR1@120) {sys.argv[2]} s after its limit "
      f"came within reach; checkpointed, requeued, resumed (restart_count 1): "
      f"{len(a)} window losses and the weights equal the uninterrupted run's")
PYEOF

# 3. A rank killed under srun: the job ends (not a hang), srun names the
#    task, and the last checkpoint on disk resumes.
sed -e "s|dir: $WORK/pre|dir: $WORK/killed|" pre.yaml >killed.yaml
cat >>killed.yaml <<EOF
dist:
  timeout_s: 5
EOF
timeout 240 sbatch --wait --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
  --time=5 --output="$WORK/killed-%j.out" --no-requeue \
  --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN" \
  "$REPO/launch/slurm/train.sbatch" "$WORK/killed.yaml" --training.checkpoint_every=20 \
  >killed-sbatch.txt 2>&1 &
waiter=$!
for _ in $(seq 600); do
  [ -f killed/metrics.jsonl ] && [ "$(grep -c '"checkpoint"' killed/metrics.jsonl)" -ge 2 ] && break
  sleep 0.1
done
job=$(awk '/Submitted batch job/ {print $4}' killed-sbatch.txt)
victim=$(pgrep -f "train --config $WORK/killed.yaml" | tail -1)
[ -n "$victim" ] || fail "killed: no rank process found"
start=$SECONDS
kill -KILL "$victim"
rc=0
wait "$waiter" || rc=$?
took=$((SECONDS - start))
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat killed-sbatch.txt; tail -20 "killed-$job.out"; fail "killed rank: sbatch --wait exit $rc (0: not noticed, 124: hung)"; }
# The survivor names the dead peer within dist.timeout_s (5 s) and its
# step ends; measured 6 to 8 s from the SIGKILL to the job's end (4
# runs, 2026-12-01). The bound: the timeout and 15 s for the step's and
# the job's teardown on a loaded machine (train.sbatch's own wait for a
# step, MEMTRAIN_STEP_WAIT_S, is 60 s: a job that waited for it fails).
[ "$took" -lt 20 ] || fail "killed rank: the job took ${took} s to end (dist.timeout_s 5 s + 15 s)"
grep -qE "srun: error: .*task [01]: Killed" "killed-$job.out" ||
  { tail -20 "killed-$job.out"; fail "killed rank: srun named no killed task"; }
echo "killed rank: job $job ended (sbatch exit $rc) ${took} s after SIGKILL: $(grep -m1 'srun: error' "killed-$job.out")"
# The resume trains 20 windows past the newest checkpoint (the rest of
# the run's 3 epochs would prove nothing more).
newest=$(ls killed/checkpoints | sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1)
[ -n "$newest" ] || { ls -la killed/checkpoints; fail "killed rank: no checkpoint on disk"; }
"$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --config killed.yaml --resume=auto \
  --training.checkpoint_every=20 --training.max_windows=$((newest + 20)) \
  >killed-resume.log 2>&1 || { tail -20 killed-resume.log; fail "resume after the killed rank"; }
grep -q "resumed from .*ckpt-0*$newest.safetensors at step $newest" killed-resume.log ||
  { grep "resumed from" killed-resume.log; fail "killed rank: did not resume from its newest checkpoint (step $newest)"; }
echo "killed rank: --resume auto finished, $(grep -o 'resumed from [^ ,]*' killed-resume.log)"

# 4. scaling.sbatch at the smallest size.
out=$(timeout 240 sbatch --wait --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
  --time=5 --output="$WORK/scaling-%j.out" \
  --export=ALL,MEMTRAIN_HOME="$REPO",MEMTRAIN_BIN="$MEMTRAIN",MEMTRAIN_SCALING_DIR="$WORK/scaling" \
  "$REPO/launch/slurm/scaling.sbatch" --accum 1 --micro 8 --hidden 32 --depth 2 \
  --features 16 --windows 3 --warmup 1 2>&1)
rc=$?
[ "$rc" = 0 ] || { echo "$out"; squeue; tail -20 scaling-*.out; fail "scaling.sbatch: exit $rc (124: not finished in 240 s)"; }
"$PY" - scaling/bench_scaling.csv <<'PYEOF' || fail "bench_scaling.csv"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ranks = sorted({int(r["ranks"]) for r in rows})
assert ranks == [1, 2], ranks
assert __import__("os").path.getsize(sys.argv[1].replace(".csv", ".png")) > 0
print(f"scaling.sbatch: {len(rows)} rows at ranks {ranks}, and its plot")
PYEOF

# 5. The daemons stop.
pids=$(cat cluster/*.pid)
"$HERE/cluster.sh" stop "$WORK/cluster"
trap - EXIT
for p in $pids; do
  ! kill -0 "$p" 2>/dev/null || fail "daemon $p still running after stop"
done
echo "PASS slurm"
