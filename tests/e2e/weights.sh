#!/usr/bin/env bash
# Weights by name through the executable (docs/models.md "Weights: pretrained,
# frozen, exported, evaluated"), with resnet50 on 32x32 images:
# - a 2-rank run trains one epoch and checkpoints; `memtrain export` of the
#   checkpoint equals model.safetensors tensor for tensor (buffers
#   included, rank 0's batch-norm statistics);
# - `memtrain eval --weights` of the export at 1 and 2 ranks reports the
#   training run's last validation of those weights (accuracy exactly,
#   loss within 1e-6: batches are summed in another grouping), writing
#   nothing;
# - a run with model.pretrained = the export and output.save_initial=true
#   starts from it exactly (initial.safetensors = the export, byte for
#   byte), reports "320 of 320 tensors loaded" (stdout and metrics.jsonl);
#   another head loads with model.pretrained_strict=false and a report of
#   the two mismatched head tensors; a 2-rank run resumed after window 1
#   (model.pretrained's file deleted: not read again) ends bit for bit
#   with the uninterrupted run's weights and batch-norm statistics;
# - model.freeze=[conv1,bn1,layer1]: those tensors (batch-norm statistics
#   too) stay bit-identical, the others train, and the window's
#   allreduce_bytes drop by exactly the frozen parameters' bytes;
# - bad inputs exit 2 with their message (at 2 ranks: agreed): a missing
#   pretrained file, a strict head mismatch naming fc.weight and fc.bias,
#   a freeze prefix matching nothing, eval of weights of another head,
#   export of a missing or damaged checkpoint;
# - optional (skipped without timm): timm's resnet50 loads the export with
#   load_state_dict(strict=True) and gives eval's loss and accuracy on
#   val.h5; memtrain's eval of a seresnext50_32x4d state dict saved by timm
#   gives timm's (tests/peers/timm_check.py, eval mode, within 1e-5).
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/common.sh"
CHECK="$PEER_SCRIPTS/weights_check.py"

"$MEMTRAIN" make-data --kind images --height 32 --width 32 --samples 16 \
  --classes 3 --seed 4 --out train.h5 >/dev/null
"$MEMTRAIN" make-data --kind images --height 32 --width 32 --samples 12 \
  --classes 3 --seed 4 --split val --out val.h5 >/dev/null

common=(--model.name=resnet50 --data.train=train.h5 --data.val=val.h5
  --data.batch_size=4 --training.effective_batch_size=8 --training.lr=0.01
  --training.momentum=0 --data.prefetch=0)
json_field() {  # FILE TYPE FIELD: FIELD of the last record of TYPE
  "$PY" -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1])]
print([x for x in r if x.get("type")==sys.argv[2]][-1][sys.argv[3]])' "$@"
}
expect_fail() {  # NAME MESSAGE-PATTERN COMMAND...: exit 2 and the message
  local name=$1 pattern=$2
  shift 2
  local rc=0
  "$@" >"$name.log" 2>&1 || rc=$?
  [ $rc = 2 ] || { cat "$name.log"; fail "$name: exit $rc, expected 2"; }
  grep -q -- "$pattern" "$name.log" || { cat "$name.log"; fail "$name: no '$pattern'"; }
  echo "$name: exit 2: $(grep -m1 'error' "$name.log" | cut -c1-200)"
}

# 1. Train and checkpoint (2 ranks, one epoch: 2 windows, a validation).
mpi -np 2 "$MEMTRAIN" train "${common[@]}" --training.epochs=1 \
  --output.dir=a >a.log 2>&1 || { cat a.log; fail "training run a"; }
ckpt=a/checkpoints/ckpt-00000002.safetensors
[ -f $ckpt ] || fail "no checkpoint $ckpt"
"$MEMTRAIN" export --checkpoint $ckpt --out a.safetensors | tee export.log
grep -q "exported 320 tensors of model resnet50 (step 2)" export.log || fail "export line"
"$PY" "$CHECK" equal a.safetensors a/model.safetensors || fail "export != model.safetensors"

# 2. eval at 1 and 2 ranks = the run's validation of those weights.
val_loss=$(json_field a/metrics.jsonl validation val_loss)
val_acc=$(json_field a/metrics.jsonl validation val_accuracy)
for np in 1 2; do
  before=$(ls a | sort | tr '\n' ' ')
  mpi -np $np "$MEMTRAIN" eval "${common[@]}" --output.dir=a \
    --weights a.safetensors >eval$np.log 2>&1 || { cat eval$np.log; fail "eval np $np"; }
  [ "$(ls a | sort | tr '\n' ' ')" = "$before" ] || fail "eval wrote into output.dir"
  grep '"type":"eval"' eval$np.log >eval$np.json || fail "no eval record"
  l=$(json_field eval$np.json eval val_loss)
  acc=$(json_field eval$np.json eval val_accuracy)
  echo "eval np $np: val_loss $l val_accuracy $acc (training run: $val_loss $val_acc)"
  [ "$acc" = "$val_acc" ] || fail "eval np $np: accuracy $acc != $val_acc"
  "$PY" -c "import sys; a,b=float('$l'),float('$val_loss'); sys.exit(0 if abs(a-b)<=1e-6*abs(b) else 1)" ||
    fail "eval np $np: val_loss $l != $val_loss"
done

# 3. A new run from the export starts from it exactly.
"$MEMTRAIN" train "${common[@]}" --training.max_windows=1 \
  --model.pretrained=a.safetensors --output.save_initial=true \
  --output.dir=b >b.log 2>&1 || { cat b.log; fail "run b"; }
grep -q "model.pretrained: a.safetensors: 320 of 320 tensors loaded" b.log ||
  { cat b.log; fail "no pretrained report line"; }
[ "$(json_field b/metrics.jsonl pretrained loaded)" = 320 ] || fail "pretrained record"
"$PY" "$CHECK" equal a.safetensors b/initial.safetensors || fail "initial != export"
# Another head (5 classes): strict refuses naming the head, non-strict loads
# the rest and reports it.
expect_fail strict_head "only the head (fc) differs" \
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --model.num_classes=5 \
  --model.pretrained=a.safetensors --output.dir=c
grep -q "fc.weight \[3, 2048\] vs \[5, 2048\], fc.bias \[3\] vs \[5\]" strict_head.log ||
  fail "strict: the head keys are not listed"
"$MEMTRAIN" train "${common[@]}" --training.max_windows=1 --model.num_classes=5 \
  --model.pretrained=a.safetensors --model.pretrained_strict=false \
  --output.dir=c >c.log 2>&1 || { cat c.log; fail "run c"; }
grep -q "model.pretrained: a.safetensors: 318 of 320 tensors loaded" c.log || fail "c: loaded"
grep -q "model.pretrained: 2 shape-mismatched (file vs model): fc.weight \[3, 2048\] vs \[5, 2048\], fc.bias \[3\] vs \[5\]" c.log ||
  { cat c.log; fail "c: mismatch line"; }

# Resume: the checkpoint wins, model.pretrained is not read again (its
# file is gone), and the 2-rank run resumed after window 1 ends with the
# uninterrupted run's weights, batch-norm statistics included, bit for bit.
cp a.safetensors p.safetensors
for run in r2 r1; do
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --model.pretrained=p.safetensors \
    --training.max_windows=${run#r} --output.dir=$run >$run.log 2>&1 ||
    { cat $run.log; fail "run $run"; }
done
rm p.safetensors
mpi -np 2 "$MEMTRAIN" train "${common[@]}" --model.pretrained=p.safetensors \
  --training.max_windows=2 --output.dir=r1 --resume auto >r1b.log 2>&1 ||
  { cat r1b.log; fail "resume with model.pretrained gone"; }
! grep -q "model.pretrained:" r1b.log || fail "model.pretrained read again on resume"
"$PY" "$CHECK" equal r1/model.safetensors r2/model.safetensors ||
  fail "resumed run != uninterrupted run"

# 4. Freeze: bit-identical, and exactly their bytes fewer all-reduced.
frozen=(conv1 bn1 layer1)
for run in free frozen; do
  extra=()
  [ $run = frozen ] && extra=(--model.freeze=[conv1,bn1,layer1])
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --training.max_windows=1 \
    --model.pretrained=a.safetensors --output.save_initial=true "${extra[@]}" \
    --output.dir=$run >$run.log 2>&1 || { cat $run.log; fail "run $run"; }
done
"$PY" "$CHECK" frozen frozen/initial.safetensors frozen/model.safetensors "${frozen[@]}" ||
  fail "frozen tensors moved"
bytes=$("$PY" "$CHECK" param_bytes a.safetensors "${frozen[@]}")
free_b=$(json_field free/metrics.jsonl window allreduce_bytes)
frozen_b=$(json_field frozen/metrics.jsonl window allreduce_bytes)
echo "allreduce_bytes: $free_b without freeze, $frozen_b with; frozen parameters: $bytes bytes"
[ $((free_b - frozen_b)) = "$bytes" ] || fail "allreduce_bytes drop $((free_b - frozen_b)) != $bytes"
grep -q "of them frozen (33 tensors, model.freeze)" frozen.log || fail "banner: frozen"

# 5. Bad inputs.
expect_fail missing_pretrained "model.pretrained: cannot open 'nope.safetensors'" \
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --model.pretrained=nope.safetensors --output.dir=d
expect_fail freeze_nothing "'layer9' matches no parameter" \
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --model.freeze=[conv1,layer9] --output.dir=d
expect_fail eval_head "fc.weight \[3, 2048\] vs \[5, 2048\]" \
  mpi -np 2 "$MEMTRAIN" eval "${common[@]}" --model.num_classes=5 --weights a.safetensors
expect_fail export_missing "cannot open 'nope.safetensors'" \
  "$MEMTRAIN" export --checkpoint nope.safetensors --out x.safetensors
cp $ckpt damaged.safetensors
# one byte near the end (the random states): the checksum catches it
printf '\x01' | dd of=damaged.safetensors bs=1 conv=notrunc status=none \
  seek=$(($(stat -c %s damaged.safetensors) - 1000))
expect_fail export_damaged "is corrupt or was edited" \
  "$MEMTRAIN" export --checkpoint damaged.safetensors --out x.safetensors
[ ! -e x.safetensors ] || fail "export wrote a file for a bad checkpoint"
[ ! -e d ] || [ -z "$(ls d/*.safetensors 2>/dev/null)" ] || fail "a refused run wrote weights"
# 6. Optional: timm itself (tests/peers/timm_check.py). Give an interpreter
# that imports timm, h5py and safetensors as MEMTRAIN_TIMM_PYTHON (with
# PYTHONPATH as it needs); without one this part is skipped.
TIMM=""
for c in ${MEMTRAIN_TIMM_PYTHON:-} "$PY" /opt/memtrain/torch-venv/bin/python; do
  if "$c" -c 'import timm, h5py, safetensors' >/dev/null 2>&1; then TIMM=$c; break; fi
done
if [ -z "$TIMM" ]; then
  echo "SKIP: no Python with timm, h5py and safetensors (set MEMTRAIN_TIMM_PYTHON)"
else
  # (the last line: importing timm may print notes of its own first)
  tcheck() { "$TIMM" "$PEER_SCRIPTS/timm_check.py" "$@" 2>/dev/null | tail -1; }
  close() { "$PY" -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
ok = abs(a['val_loss']-b['val_loss']) <= 1e-5*abs(b['val_loss']) and a['val_accuracy']==b['val_accuracy']
print(('match' if ok else 'MISMATCH'), 'timm', a, 'memtrain', {k: b[k] for k in a}); sys.exit(0 if ok else 1)" "$1" "$2"; }
  # memtrain -> timm: the trained resnet50 export, strict, same figures.
  close "$(tcheck loss resnet50 a.safetensors val.h5)" "$(cat eval1.json)" ||
    fail "timm's resnet50 on memtrain's weights"
  # timm -> memtrain: timm's seresnext50_32x4d state dict, strict, eval.
  tcheck make seresnext50_32x4d 3 3 timm.safetensors
  [ -s timm.safetensors ] || fail "timm make"
  "$MEMTRAIN" eval "${common[@]}" --model.name=seresnext50_32x4d \
    --weights timm.safetensors >eval_timm.log 2>&1 || { cat eval_timm.log; fail "eval of timm's weights"; }
  close "$(tcheck loss seresnext50_32x4d timm.safetensors val.h5)" \
    "$(grep '"type":"eval"' eval_timm.log)" || fail "memtrain's seresnext50_32x4d on timm's weights"
fi
echo "PASS weights"
