#!/usr/bin/env bash
# The few-shot cosine transformer head (model.head: cosine_transformer;
# ARCHITECTURE.md, Note [The few-shot cosine transformer]) through the
# executable, on episodes no other test draws (make-data --seed 5,
# data.seed 13):
# - the first window (8 episodes, feature MLP) at the paper's head sizes and
#   at 1 head of the embedding's width (no output projection) x depth 2: its
#   loss and the weights after one SGD step equal an independent PyTorch
#   reference laid out as the official code (tests/peers/fsct_reference.py),
#   within 1e-5;
# - 2 ranks x 2 micro-steps x 2 episodes gives the 1-rank loss and weights;
# - the CNN on /images (group norm): 2 ranks x 1 episode per micro-step
#   gives the 1 x 1 x 2 update;
# - resnet50 (batch norm, whose statistics are per micro-batch: one episode
#   per micro-step on both sides): 2 ranks give the 1-rank x 2 micro-step
#   loss and weights (running statistics aside: each rank keeps its own).
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

# PyTorch for the reference: the torch venv, $PY or Debian's python3.
TPY=""
for c in /opt/memtrain/torch-venv/bin/python "$PY" /usr/bin/python3; do
  if "$c" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then TPY=$c; break; fi
done
window_loss() { "$PY" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "\"window\"" in l][0]["loss"])' "$1/metrics.jsonl"; }
# The largest |w1 - w2| over two model.safetensors, batch-norm running
# statistics left out.
weights_diff() { "$PY" - "$PEER_SCRIPTS" "$1" "$2" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_read as s
a, _ = s.load(sys.argv[2]); b, _ = s.load(sys.argv[3])
keep = lambda d: {k: v for k, v in d.items() if "running_" not in k and "num_batches" not in k}
print(f"{s.max_abs_diff(keep(a), keep(b)):.3e}")
PYEOF
}
close() {  # A B TOL: |A - B| <= TOL
  "$PY" -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t else 1)" "$@"
}

"$MEMTRAIN" make-data --kind fewshot --out fs.h5 --seed 5
common=(--data.train=fs.h5 --model.head=cosine_transformer --data.episodes.n_way=5
  --data.episodes.k_shot=2 --data.episodes.n_query=3 --data.episodes.per_epoch=8
  --data.seed=13 --data.val_classes=0.25 --model.hidden=16 --model.depth=2
  --model.embed_dim=16 --training.max_windows=1 --training.lr=0.1
  --training.momentum=0 --validation.episodes=0)
# name: heads dim_head mlp_dim depth
for setting in "paper 8 64 512 1" "onehead 1 16 32 2"; do
  read -r name heads dh mlp depth <<<"$setting"
  keys=(--model.fsct.heads=$heads --model.fsct.dim_head=$dh
    --model.fsct.mlp_dim=$mlp --model.fsct.depth=$depth)
  mpi -np 1 "$MEMTRAIN" train "${common[@]}" "${keys[@]}" --data.batch_size=8 \
    --output.save_initial=true --output.dir=$name >$name.log 2>&1 || { cat $name.log; fail "$name"; }
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" "${keys[@]}" --data.batch_size=2 \
    --training.effective_batch_size=8 --output.dir=$name-2x2x2 >$name-2.log 2>&1 ||
    { cat $name-2.log; fail "$name 2x2x2"; }
  a=$(window_loss $name)
  b=$(window_loss $name-2x2x2)
  d=$(weights_diff $name/model.safetensors $name-2x2x2/model.safetensors)
  echo "$name: window loss 1x1x8 $a, 2x2x2 $b; max |w1 - w2| = $d"
  close "$a" "$b" 1e-5 && close "$d" 0 1e-5 || fail "$name: the split changed the update"
  if [ -n "$TPY" ]; then
    read -r r rd < <("$TPY" "$PEER_SCRIPTS/fsct_reference.py" fs.h5 $name/initial.safetensors \
      $name/model.safetensors 5 2 3 8 13 0.25 2 0.1 $heads $dh $mlp $depth)
    echo "$name: PyTorch reference loss $r (memtrain $a); max |w - w_reference| after the step = $rd"
    "$PY" -c "import sys; a,r=map(float,sys.argv[1:]); sys.exit(0 if abs(a-r)<=1e-5*max(1,abs(r)) else 1)" \
      "$a" "$r" || fail "$name: memtrain $a vs reference $r"
    close "$rd" 0 1e-5 || fail "$name: weights after the step differ from the reference by $rd"
  else
    echo "SKIP: no python3 with torch and h5py for the reference"
  fi
done

# The CNN on /images: group norm is per sample, so any split is one update.
"$MEMTRAIN" make-data --kind images --out img.h5 --classes 12 --samples 480 --height 8 --width 8
cnn=(--data.train=img.h5 --model.name=cnn --model.hidden=8 --model.head=cosine_transformer
  --model.fsct.heads=2 --model.fsct.dim_head=8 --model.fsct.mlp_dim=16
  --data.episodes.n_way=3 --data.episodes.n_query=4 --data.episodes.per_epoch=4
  --training.effective_batch_size=4 --training.max_windows=1 --validation.episodes=0)
mpi -np 1 "$MEMTRAIN" train "${cnn[@]}" --data.batch_size=4 --output.dir=cnn1 >cnn1.log 2>&1 ||
  { cat cnn1.log; fail "cnn 1 rank"; }
mpi -np 2 "$MEMTRAIN" train "${cnn[@]}" --data.batch_size=1 --output.dir=cnn2 >cnn2.log 2>&1 ||
  { cat cnn2.log; fail "cnn 2 ranks"; }
a=$(window_loss cnn1); b=$(window_loss cnn2)
d=$(weights_diff cnn1/model.safetensors cnn2/model.safetensors)
echo "cnn: window loss 1x1x4 $a, 2x2x1 $b; max |w1 - w2| = $d"
close "$a" "$b" 1e-5 && close "$d" 0 1e-5 || fail "cnn: the split changed the update"

# resnet50 on 40 x 40 images (it needs at least 33 x 33), one episode per
# micro-step: 1 rank x 2 micro-steps == 2 ranks x 1.
"$MEMTRAIN" make-data --kind images --out rn.h5 --classes 8 --samples 96 --channels 3 \
  --height 40 --width 40 >/dev/null
rn=(--data.train=rn.h5 --model.name=resnet50 --model.head=cosine_transformer
  --data.episodes.n_way=3 --data.episodes.n_query=2 --data.episodes.per_epoch=2
  --data.batch_size=1 --training.effective_batch_size=2 --training.max_windows=1
  --training.lr=0.01 --validation.episodes=0 --data.val_classes=0.25)
mpi -np 1 "$MEMTRAIN" train "${rn[@]}" --output.dir=rn1 >rn1.log 2>&1 || { cat rn1.log; fail "resnet50 1 rank"; }
mpi -np 2 "$MEMTRAIN" train "${rn[@]}" --output.dir=rn2 >rn2.log 2>&1 || { cat rn2.log; fail "resnet50 2 ranks"; }
a=$(window_loss rn1); b=$(window_loss rn2)
d=$(weights_diff rn1/model.safetensors rn2/model.safetensors)
echo "resnet50: window loss 1x2x1 $a, 2x1x1 $b; max |w1 - w2| = $d"
close "$a" "$b" 1e-5 && close "$d" 0 1e-5 || fail "resnet50: 2 ranks differ from 1"
echo "e2e fsct: ok"
