#!/usr/bin/env bash
# Batch-norm under accumulation and data parallelism (Note [Batch-norm and
# data parallelism]) through the executable, resnet50 on 17 images of
# 48x48 (layer4 is 2x2), learning rate 0.1, no momentum, weights compared
# tensor by tensor as max |a - b| / max(1, max |a|) (sync_bn_check.py):
# (a) model.sync_bn=true: 2 ranks at micro-batch 4 and 4 ranks at 2 equal
#     1 rank at 8 over a whole epoch of 3 windows (8, 8, 1 samples: in the
#     last one rank 0 of 2, and ranks 0-2 of 4, run an empty micro-step),
#     parameters AND running statistics within 1e-4 (4 ranks without the
#     shared-memory all-reduce, so that gradient buckets start inside
#     backward between the batch-norm sums, empty micro-steps included),
#     and 2 ranks with every stage checkpointed likewise (158 batch-norm
#     all-reduces a micro-step: the recomputation's too); every window
#     all-reduces the gradient as often as without sync_bn and has
#     53 x 2 batch-norm all-reduces per micro-step of 850,344 bytes
#     (float64: [2C + 1] in forward, [2C] in backward, C summed over the 53
#     batch-norms = 26,560), counted as syncbn_calls/syncbn_bytes;
# (b) model.sync_bn=false: 2 ranks at micro-batch 4 equal 1 rank with 2
#     micro-steps of 4 (gradient accumulation): parameters within 1e-5
#     after one window; the running statistics differ (rank 0's saw one
#     micro-batch, the single rank's two);
# (c) (a) and (b) differ after one window (parameters by more than 1e-3);
# 1 rank with sync_bn=true is bit-identical to sync_bn=false (no hook);
# refusals: sync_bn on mlp (exit 2, the message), and an out-of-memory
# error with sync_bn ends the job saying that sync_bn disables the replay.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
CHECK="$PEER_SCRIPTS/sync_bn_check.py"

"$MEMTRAIN" make-data --kind images --height 48 --width 48 --samples 17 \
  --classes 3 --seed 5 --out train.h5 >/dev/null
common=(--model.name=resnet50 --data.train=train.h5 --data.val=
  --training.lr=0.1 --training.momentum=0 --data.prefetch=0)
run() {  # NAME NP MICRO ACCUM [extra]: one run, which must succeed
  mpi -np "$2" ${MPI_ARGS:-} "$MEMTRAIN" train "${common[@]}" --data.batch_size="$3" \
    --training.gradient_accumulation_steps="$4" --output.dir="$1" "${@:5}" \
    >"$1.log" 2>&1 || { cat "$1.log"; fail "run $1"; }
  rm -rf "$1/checkpoints"  # 94 MB each, never read here: the disk is shared
}
windows() {  # FILE FIELD...: the fields of every window record, one a line
  "$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("type") == "window":
        print(" ".join(str(r[f]) for f in sys.argv[2:]))' "$@"
}
within() {  # VALUE LIMIT: VALUE <= LIMIT
  "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$1" "$2"
}

# (a) one epoch: 1 rank x 8 = 2 ranks x 4 = 4 ranks x 2 with sync_bn.
run one 1 8 1 --training.epochs=1
run sync2 2 4 1 --training.epochs=1 --model.sync_bn=true
# 4 ranks through MPI's own all-reduce (no shared-memory window): the
# gradient buckets then start inside every window's backward, between the
# batch-norm sums, also in the last window where ranks 0-2 run an empty
# micro-step.
MEMTRAIN_MPI_SHM=0 MPI_ARGS="-x MEMTRAIN_MPI_SHM" \
  run sync4 4 2 1 --training.epochs=1 --model.sync_bn=true
# Every stage checkpointed: the recomputation in backward sums each of
# the 52 batch-norms of layer1..layer4 once more (158 a micro-step), between
# the buckets' all-reduces, and changes nothing.
MEMTRAIN_MPI_SHM=0 MPI_ARGS="-x MEMTRAIN_MPI_SHM" \
  run sync2ck 2 4 1 --training.epochs=1 --model.sync_bn=true \
  --training.gradient_checkpointing=all
windows sync2ck/metrics.jsonl syncbn_calls buckets_early | tee sync2ck.windows
awk '{ if ($1 != 158 || $2 < 1) exit 1 }' sync2ck.windows ||
  fail "sync2ck: not 158 batch-norm all-reduces with buckets started in backward"
run local2e 2 4 1 --training.epochs=1
for r in one sync2 sync4 local2e; do
  echo "$r: samples accum_steps allreduce_calls allreduce_bytes syncbn_calls syncbn_bytes buckets_early"
  windows $r/metrics.jsonl samples accum_steps allreduce_calls allreduce_bytes \
    syncbn_calls syncbn_bytes buckets_early | tee $r.windows
done
awk '{ if ($7 < 1) exit 1 }' sync4.windows || fail "sync4: buckets not started in backward"
[ "$(cut -d' ' -f1 one.windows | tr '\n' ' ')" = "8 8 1 " ] || fail "windows are not 8, 8, 1"
for r in sync2 sync4; do
  "$PY" -c 'import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (a, b)
for x, y in zip(a, b):
    steps = int(x[1])
    assert steps == 1, x
    # The gradient all-reduce: as without sync_bn (bytes: at 2 ranks;
    # at 4 the window totals have more per-rank slots).
    n = 4 if sys.argv[3] == "2" else 3
    assert x[2:n] == y[2:n], ("gradient all-reduce differs from sync_bn=false", x, y)
    assert int(x[4]) == 106 * steps and int(x[5]) == 850344 * steps, x
' $r.windows local2e.windows ${r#sync} || fail "$r: window records"
done
awk '{ if ($5 != 0 || $6 != 0) exit 1 }' one.windows || fail "1 rank: batch-norm all-reduces"
awk '{ if ($5 != 0 || $6 != 0) exit 1 }' local2e.windows || fail "sync_bn=false: batch-norm all-reduces"
for r in sync2 sync4 sync2ck; do
  read -r ap ab ac < <("$PY" "$CHECK" one/model.safetensors $r/model.safetensors)
  echo "(a) sync_bn, 1 rank x 8 vs $r: params $ap, running statistics $ab, num_batches_tracked $ac"
  within "$ap" 1e-4 && within "$ab" 1e-4 && [ "$ac" = equal ] ||
    fail "(a) $r with sync_bn differs from 1 rank at 8"
done

# (b) one window: 2 ranks x 4 without sync_bn = 1 rank x 2 micro-steps x 4.
run local2 2 4 1 --training.max_windows=1
run accum1 1 4 2 --training.max_windows=1
read -r bp bb bc < <("$PY" "$CHECK" accum1/model.safetensors local2/model.safetensors)
echo "(b) sync_bn=false, 2 ranks x 4 vs 1 rank x 2 x 4: params $bp, running statistics $bb, num_batches_tracked $bc"
within "$bp" 1e-5 || fail "(b) parameters differ: $bp"
within 1e-3 "$bb" && [ "$bc" = differ ] ||
  fail "(b) running statistics equal ($bb, $bc): rank 0's should have seen one micro-batch"

# (c) one window of (a) vs (b).
run one1 1 8 1 --training.max_windows=1
run one1s 1 8 1 --training.max_windows=1 --model.sync_bn=true
read -r cp cb _ < <("$PY" "$CHECK" one1/model.safetensors local2/model.safetensors)
echo "(c) 1 rank x 8 (= sync_bn 2 x 4) vs 2 ranks x 4 without sync_bn: params $cp, running statistics $cb"
within 1e-3 "$cp" || fail "(c) the two kinds of batch-norm give the same update ($cp)"
"$PY" "$PEER_SCRIPTS/weights_check.py" equal one1/model.safetensors one1s/model.safetensors ||
  fail "1 rank: sync_bn=true changed the weights"

# Refusals.
rc=0
"$MEMTRAIN" make-data --kind features --samples 16 --out f.h5 >/dev/null
mpi -np 2 "$MEMTRAIN" train --data.train=f.h5 --data.val= --model.sync_bn=true \
  --output.dir=mlp >mlp.log 2>&1 || rc=$?
[ $rc = 2 ] || { cat mlp.log; fail "sync_bn on mlp: exit $rc, expected 2"; }
grep -q "model.sync_bn: true needs a model with batch-norm (resnet50, seresnext50_32x4d); model.name=mlp has none" mlp.log ||
  { cat mlp.log; fail "sync_bn on mlp: no message"; }
echo "mlp: exit 2: $(grep -m1 error mlp.log | cut -c1-160)"
rc=0
mpi -np 2 "$MEMTRAIN" train "${common[@]}" --data.batch_size=4 \
  --training.max_windows=1 --model.sync_bn=true --memory.test_oom_rank=1 \
  --output.dir=oom >oom.log 2>&1 || rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || { cat oom.log; fail "OOM with sync_bn: exit $rc"; }
grep -q "model.sync_bn=true disables the OOM replay" oom.log ||
  { cat oom.log; fail "OOM with sync_bn: no message"; }
[ ! -e oom/model.safetensors ] || fail "a model was written by a failed run"
echo "OOM with sync_bn: exit $rc: $(grep -m1 'out of device memory' oom.log | cut -c1-160)..."
echo "e2e sync_bn: ok"
