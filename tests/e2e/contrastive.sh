#!/usr/bin/env bash
# Contrastive pairs through the executable (Note [Exact contrastive
# accumulation]):
# - make-data --kind pairs and inspect;
# - training.contrastive_accumulation=exact: one window of 48 pairs split as
#   1x1x48, 1x6x8, 2x3x8, 4x2x6 and 4 ranks x micro 5 (uneven: 5, 5, 2)
#   gives the same loss and weights (within 1e-5), equal to an independent
#   PyTorch reference of the one-big-batch loss and its SGD step
#   (contrastive_reference.py), with /pair_ids too;
# - local (each micro-batch its own batch) gives another loss and update;
# - the embeddings' all-gather is counted apart: one per exact window, none
#   for local, and the gradient all-reduce is the same;
# - a dual encoder learns the synthetic correspondence (validation top-1
#   retrieval well above chance), and data.batch_size=auto fits it under a
#   budget with the same update;
# - launch/configs/clip-heads-v100.yaml starts and runs one window;
# - bad inputs: a pair file for model.name=mlp, /features_b of another
#   length, a negative pair id.
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/common.sh"

TPY=""
for c in "$PY" /usr/bin/python3; do
  if "$c" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then TPY=$c; break; fi
done
HPY=""  # h5py, to write files make-data does not
for c in "$PY" /usr/bin/python3; do
  if "$c" -c 'import h5py, numpy' >/dev/null 2>&1; then HPY=$c; break; fi
done

"$MEMTRAIN" make-data --kind pairs --samples 48 --features 12 --context 10 \
  --latent 8 --noise 0.3 --seed 5 --out pairs.h5
"$MEMTRAIN" inspect pairs.h5 | tee inspect.txt
grep -q "layout: pairs, 48 rows: /features_a \[12\] float32 with /features_b \[10\]" inspect.txt ||
  fail "inspect: pair layout not reported"

common=(--model.name=dual_encoder --model.hidden=16 --model.depth=2
  --model.embed_dim=8 --training.effective_batch_size=48 --training.max_windows=1
  --training.lr=0.1 --data.val= --output.save_initial=true)
window() { "$PY" -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if "\"window\"" in l][0]
print(r[sys.argv[2]])' "$1/metrics.jsonl" "$2"; }
close() { "$PY" -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t else 1)" "$@"; }
run() {  # NAME NP MICRO [more arguments]
  local name=$1 np=$2 micro=$3
  shift 3
  mpi -np "$np" "$MEMTRAIN" train "${common[@]}" --data.batch_size="$micro" \
    --output.dir="$name" "$@" >"$name.log" 2>&1 || { cat "$name.log"; fail "$name"; }
}

for data in pairs.h5 ids.h5; do
  if [ $data = ids.h5 ]; then
    # Rows 2k and 2k+1 are one pair id: each is left out of the other's
    # negatives.
    [ -n "$HPY" ] || { echo "SKIP: no h5py for the /pair_ids file"; continue; }
    "$HPY" - <<'EOF'
import h5py, numpy as np
with h5py.File("pairs.h5") as f, h5py.File("ids.h5", "w") as g:
    for k in ("features_a", "features_b"):
        g[k] = f[k][...]
    g["pair_ids"] = np.arange(48, dtype=np.int64) // 2
EOF
  fi
  tag=${data%.h5}
  run $tag-1x1x48 1 48 --data.train=$data
  run $tag-1x6x8 1 8 --data.train=$data
  run $tag-2x3x8 2 8 --data.train=$data
  run $tag-4x2x6 4 6 --data.train=$data
  run $tag-4xuneven 4 5 --data.train=$data
  ref=$(window $tag-1x1x48 loss)
  for split in 1x6x8 2x3x8 4x2x6 4xuneven; do
    l=$(window $tag-$split loss)
    d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" $tag-1x1x48/model.safetensors $tag-$split/model.safetensors)
    echo "$tag exact $split: loss $l (1x1x48: $ref), max |w - w(1x1x48)| = $d"
    close "$l" "$ref" 1e-5 && close "$d" 0 1e-5 || fail "$tag: $split changed the exact update"
    [ "$(window $tag-$split allgather_calls)" = 1 ] || fail "$split: not one all-gather"
    [ "$(window $tag-$split allreduce_calls)" = "$(window $tag-1x1x48 allreduce_calls)" ] ||
      fail "$split: another number of gradient all-reduces"
  done
  if [ -n "$TPY" ]; then
    out=$("$TPY" "$PEER_SCRIPTS/contrastive_reference.py" $data $tag-1x1x48/initial.safetensors 2 0.1 \
      $tag-1x1x48/model.safetensors)
    r=$(echo "$out" | sed -n 1p)
    w=$(echo "$out" | sed -n 2p)
    echo "$tag: PyTorch reference loss $r (memtrain $ref), max |w - reference| = $w"
    close "$ref" "$r" 1e-5 && close "$w" 0 1e-5 || fail "$tag: memtrain differs from the reference"
  else
    echo "SKIP: no python3 with torch and h5py for the reference"
  fi
done

# local: each micro-batch of 8 is its own contrastive batch (7 negatives,
# not 47): another loss, another update, no all-gather.
run local-1x6x8 1 8 --data.train=pairs.h5 --training.contrastive_accumulation=local
l=$(window local-1x6x8 loss)
ref=$(window pairs-1x1x48 loss)
d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" pairs-1x1x48/model.safetensors local-1x6x8/model.safetensors)
echo "local 1x6x8: loss $l (exact: $ref), max |w - w(exact)| = $d"
close "$l" "$ref" 1e-2 && fail "local gave the exact loss"
close "$d" 0 1e-4 && fail "local gave the exact update"
[ "$(window local-1x6x8 allgather_calls)" = 0 ] || fail "local: an all-gather"

# It learns: 3 epochs of 512 pairs, validation top-1 retrieval among 128.
"$MEMTRAIN" make-data --kind pairs --samples 512 --features 24 --context 16 \
  --noise 0.3 --seed 1 --out learn.h5 >/dev/null
"$MEMTRAIN" make-data --kind pairs --samples 128 --features 24 --context 16 \
  --noise 0.3 --seed 1 --split val --out learn-val.h5 >/dev/null
mpi -np 2 "$MEMTRAIN" train --model.name=dual_encoder --model.embed_dim=16 \
  --data.train=learn.h5 --data.val=learn-val.h5 --training.effective_batch_size=64 \
  --data.batch_size=8 --training.epochs=6 --training.optimizer=adamw --training.momentum=0 \
  --training.lr=0.001 --output.dir=learn >learn.log 2>&1 || { cat learn.log; fail "learn"; }
acc=$("$PY" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "\"validation\"" in l][-1]["val_accuracy"])' learn/metrics.jsonl)
echo "learn: validation top-1 retrieval $acc among 128 pairs (chance 0.0078)"
close "$acc" 1 0.6 || fail "the dual encoder did not learn ($acc)"

# batch_size=auto under a budget: fewer pairs per micro-step, the same update.
run auto 1 auto --data.train=pairs.h5 --memory.budget=7.5MiB --model.hidden=128
run all48 1 48 --data.train=pairs.h5 --model.hidden=128
micro=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["micro_batch"])' auto/memory_plan.json)
d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" all48/model.safetensors auto/model.safetensors)
echo "auto: micro-batch $micro under 7.5 MiB; max |w48 - wauto| = $d"
"$PY" -c "import sys; m,d=int(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if 1<=m<48 and d<1e-5 else 1)" \
  "$micro" "$d" || fail "batch_size auto: micro $micro, difference $d"

# The ready config, one window, on tiny data of its widths.
"$MEMTRAIN" make-data --kind pairs --samples 192 --features 512 --context 512 \
  --out clip.h5 >/dev/null
"$MEMTRAIN" make-data --kind pairs --samples 96 --features 512 --context 512 \
  --split val --out clip-val.h5 >/dev/null
mpi -np 2 "$MEMTRAIN" train --config "$ROOT/launch/configs/clip-heads-v100.yaml" \
  --data.train=clip.h5 --data.val=clip-val.h5 --training.max_windows=1 \
  --output.dir=clip >clip.log 2>&1 || { cat clip.log; fail "clip-heads-v100.yaml"; }
grep -E "^(window|memory plan)" clip.log
[ "$(window clip samples)" = 96 ] || fail "clip-heads-v100.yaml: not a window of 96"

# Bad inputs: named, exit 2.
expect_error() {  # PATTERN command...
  local pattern=$1
  shift
  set +e
  "$@" >err.log 2>&1
  local rc=$?
  set -e
  [ $rc = 2 ] && grep -q "$pattern" err.log || { cat err.log; fail "expected exit 2 and '$pattern' (rc $rc)"; }
  grep -m1 "$pattern" err.log
}
expect_error "model.name=mlp cannot train on pairs" \
  "$MEMTRAIN" train --data.train=pairs.h5 --data.val= --output.dir=bad1
if [ -n "$HPY" ]; then
  "$HPY" - <<'EOF'
import h5py, numpy as np
with h5py.File("short.h5", "w") as g:
    g["features_a"] = np.zeros((48, 4), np.float32)
    g["features_b"] = np.zeros((47, 4), np.float32)
with h5py.File("negid.h5", "w") as g:
    g["features_a"] = np.zeros((4, 4), np.float32)
    g["features_b"] = np.zeros((4, 4), np.float32)
    g["pair_ids"] = np.array([0, 1, -1, 2], np.int64)
EOF
  expect_error "has 47 rows but '/features_a' has 48" "$MEMTRAIN" inspect short.h5
  expect_error "is negative" "$MEMTRAIN" inspect negid.h5
else
  echo "SKIP: no h5py for the bad pair files"
fi
echo "contrastive: OK"
