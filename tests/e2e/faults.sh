#!/usr/bin/env bash
# Faults through the executable, 2 ranks:
# - a NaN in the data file: the file, dataset and row are named the first
#   time a rank reads it; training.nonfinite=skip skips those windows
#   (skipped_steps in metrics.jsonl) and ends with finite weights, saying so
#   once per rank; training.nonfinite=stop stops there with that message,
#   exit status != 0, and the checkpoints on disk stay loadable;
# - SIGTERM to one rank mid-run: every rank stops at the same boundary,
#   writes one checkpoint, exits 3; --resume auto then gives the losses of an
#   uninterrupted run, line by line.
source "$(dirname "$0")/common.sh"

# 1. NaN in the data.
"$MAKE_BAD_H5" nan nan.h5
N="--data.train=nan.h5 --data.val= --data.batch_size=4 --training.epochs=2 --training.checkpoint_every=1"
mpi -np 2 "$MEMTRAIN" train $N --output.dir=skip >skip.log 2>&1 || { cat skip.log; fail "skip run"; }
"$PY" - <<'PYEOF'
import json, math, sys
sys.path.insert(0, __import__("os").environ["PEER_SCRIPTS"])
import safetensors_read
w = [json.loads(l) for l in open("skip/metrics.jsonl") if '"window"' in l]
skipped = w[-1]["skipped_steps"]
assert skipped == 2, skipped  # the NaN sample is in one window per epoch
t, _ = safetensors_read.load("skip/model.safetensors")
assert all(math.isfinite(x) for _, _, v in t.values() for x in v)
print(f"nonfinite=skip: {skipped} windows skipped, final weights finite")
PYEOF
named="data.train 'nan.h5' dataset '/features': row 5 holds nan (element 0)"
n=$(grep -c "memtrain: warning: $named" skip.log || true)
[ "$n" -ge 1 ] && [ "$n" -le 2 ] || { cat skip.log; fail "nonfinite=skip: $n warnings, want one per rank that read row 5"; }
grep -q "training.nonfinite=skip: the windows they reach are skipped" skip.log || fail "skip: no policy"
rc=0
timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train $N --output.dir=stop \
  --training.nonfinite=stop >stop.log 2>&1 || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat stop.log; fail "nonfinite=stop: exit $rc"; }
grep -q "$named, read in epoch 1; training.nonfinite=stop: stopped before any update from it" stop.log ||
  { cat stop.log; fail "no message"; }
for f in stop/checkpoints/ckpt-*.safetensors; do
  [ -e "$f" ] || continue
  step=$(basename "$f" .safetensors | sed 's/ckpt-0*//')
  mpi -np 2 "$MEMTRAIN" train $N --output.dir=stop --resume="$f" \
    --training.max_windows="$step" >load.log 2>&1 || { cat load.log; fail "checkpoint $f"; }
  echo "nonfinite=stop: exit $rc; checkpoint $f loads"
done

# 2. SIGTERM to one rank.
"$MEMTRAIN" make-data --kind features --out big.h5 --samples 16384
B="--data.train=big.h5 --data.val= --model.hidden=128 --training.epochs=2 --output.progress_every_s=1000"
mpi -np 2 "$MEMTRAIN" train $B --output.dir=full >full.log 2>&1 || { cat full.log; fail full; }
mpi -np 2 "$MEMTRAIN" train $B --output.dir=sig >sig.log 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -f sig/metrics.jsonl ] && [ "$(wc -l <sig/metrics.jsonl)" -ge 100 ] && break
  sleep 0.1
done
rank=$(pgrep -f "^$MEMTRAIN train $B --output.dir=sig" | tail -1)
kill -TERM "$rank"
rc=0
wait $job || rc=$?
[ "$rc" = 3 ] || { cat sig.log; fail "SIGTERM: exit $rc, want 3"; }
grep -q "stop requested" sig.log || { cat sig.log; fail "no stop message"; }
[ "$(ls sig/checkpoints | wc -l)" = 1 ] || fail "want exactly one checkpoint"
mpi -np 2 "$MEMTRAIN" train $B --output.dir=sig --resume=auto >sig2.log 2>&1 || { cat sig2.log; fail resume; }
"$PY" - <<'PYEOF'
import json
def losses(d):
    return [(j["step"], j["loss"]) for j in map(json.loads, open(d + "/metrics.jsonl"))
            if j["type"] == "window"]
a, b = losses("full"), losses("sig")
assert a == b, next((x, y) for x, y in zip(a, b) if x != y)
print(f"SIGTERM + resume: {len(a)} window losses identical to the uninterrupted run")
PYEOF
# 3. A rank that hangs (SIGSTOP): after dist.timeout_s rank 0 names it and
#    the job ends; a rank killed with SIGKILL: the job ends at once. Both
#    leave a checkpoint that --resume auto continues from.
T="$B --training.checkpoint_every=20 --dist.timeout_s=5"
for how in STOP KILL; do
  out=fault_$how
  start=$SECONDS
  timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train $T --output.dir=$out >$out.log 2>&1 &
  job=$!
  for _ in $(seq 600); do
    [ -f $out/metrics.jsonl ] && [ "$(grep -c checkpoint $out/metrics.jsonl)" -ge 2 ] && break
    sleep 0.1
  done
  kill -$how "$(pgrep -f "^$MEMTRAIN train $T --output.dir=$out" | tail -1)"
  rc=0
  wait $job || rc=$?
  took=$((SECONDS - start))
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat $out.log; fail "SIG$how: exit $rc"; }
  [ "$took" -lt 60 ] || fail "SIG$how: the job took ${took}s to end"
  if [ $how = STOP ]; then
    grep -q "rank 1 on [^ ]* did not arrive" $out.log || { cat $out.log; fail "hung rank not named"; }
  fi
  mpi -np 2 "$MEMTRAIN" train $T --output.dir=$out --resume=auto >$out.resume.log 2>&1 ||
    { cat $out.resume.log; fail "resume after SIG$how"; }
  grep -q "resumed from" $out.resume.log || fail "SIG$how: did not resume"
  echo "SIG$how: job ended with exit $rc after ${took}s; --resume auto finished"
done
echo "e2e faults: ok"
