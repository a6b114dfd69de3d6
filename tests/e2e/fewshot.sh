#!/usr/bin/env bash
# Few-shot episodes through the executable (Note [Episodes]):
# - the first window's loss (8 episodes, prototype and cosine heads) equals
#   an independent PyTorch reference (tests/peers/fewshot_reference.py) that
#   re-draws the episodes by the documented rule from the initial weights;
# - 2 ranks x 2 micro-steps x 2 episodes gives the same loss and weights;
# - the training and validation classes are disjoint (banner, episodes.json);
# - a class with fewer than k_shot + n_query samples is named and refused;
# - a run resumed at another world size sees the same episodes;
# - the CNN on /images, checkpointed or not: the same update;
# - data.batch_size=auto picks the episodes per micro-step under a budget;
# - launch/configs/fewshot-features-v100.yaml starts and runs one window.
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/common.sh"

# PyTorch for the reference: $PY if it has torch, else Debian's python3.
TPY=""
for c in "$PY" /usr/bin/python3; do
  if "$c" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then TPY=$c; break; fi
done

"$MEMTRAIN" make-data --kind fewshot --out fs.h5 --seed 4
common=(--data.train=fs.h5 --data.episodes.n_way=5 --data.episodes.k_shot=2
  --data.episodes.n_query=3 --data.episodes.per_epoch=8 --data.seed=9
  --data.val_classes=0.25 --model.hidden=16 --model.depth=2
  --model.embed_dim=16 --training.max_windows=1 --training.lr=0.1
  --validation.episodes=0)
window_loss() { "$PY" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "\"window\"" in l][0]["loss"])' "$1/metrics.jsonl"; }
for head in prototype cosine; do
  mpi -np 1 "$MEMTRAIN" train "${common[@]}" --model.head=$head \
    --data.batch_size=8 --output.save_initial=true --output.dir=$head \
    >$head.log 2>&1 || { cat $head.log; fail "$head"; }
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --model.head=$head \
    --data.batch_size=2 --training.effective_batch_size=8 \
    --output.dir=$head-2x2x2 >$head-2.log 2>&1 || { cat $head-2.log; fail "$head 2x2x2"; }
  a=$(window_loss $head)
  b=$(window_loss $head-2x2x2)
  d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" $head/model.safetensors $head-2x2x2/model.safetensors)
  echo "$head: window loss 1x1x8 $a, 2x2x2 $b; max |w1 - w2| = $d"
  "$PY" -c "import sys; a,b,d=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<1e-5 and d<1e-5 else 1)" \
    "$a" "$b" "$d" || fail "$head: the split changed the update"
  if [ -n "$TPY" ]; then
    r=$("$TPY" "$PEER_SCRIPTS/fewshot_reference.py" fs.h5 $head/initial.safetensors \
      $head 5 2 3 8 9 0.25 2)
    echo "$head: PyTorch reference $r"
    "$PY" -c "import sys; a,r=map(float,sys.argv[1:]); sys.exit(0 if abs(a-r)<=1e-5*max(1,abs(r)) else 1)" \
      "$a" "$r" || fail "$head: memtrain $a vs reference $r"
  else
    echo "SKIP: no python3 with torch and h5py for the reference"
  fi
done

# data.batch_size=auto counts episodes: under a budget that does not hold
# 8 episodes of this model the planner picks fewer per micro-step, and the
# update is that of 8 in one micro-step.
auto=(--data.episodes.n_way=5 --data.episodes.n_query=15 --data.episodes.per_epoch=16
  --model.head=cosine --model.hidden=256 --training.effective_batch_size=8
  --training.max_windows=1 --validation.episodes=0 --data.train=fs.h5)
mpi -np 1 "$MEMTRAIN" train "${auto[@]}" --data.batch_size=8 --output.dir=all8 >all8.log 2>&1 ||
  { cat all8.log; fail "8 episodes"; }
mpi -np 1 "$MEMTRAIN" train "${auto[@]}" --data.batch_size=auto --memory.budget=24MiB \
  --output.dir=auto >auto.log 2>&1 || { cat auto.log; fail "batch_size auto"; }
grep "memory plan" auto.log
micro=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["micro_batch"])' auto/memory_plan.json)
d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" all8/model.safetensors auto/model.safetensors)
echo "auto: $micro episodes per micro-step under 24 MiB; max |w8 - wauto| = $d"
"$PY" -c "import sys; m,d=int(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if 1<=m<8 and d<1e-5 else 1)" \
  "$micro" "$d" || fail "batch_size auto: micro $micro, difference $d"

# Resume sees the same episodes: 2 ranks for 3 windows, then resumed at 1
# rank (--resume auto), gives the uninterrupted 2-rank run's losses,
# validation accuracy and weights (within 1e-5: another split).
R=(--data.train=fs.h5 --model.head=cosine --data.episodes.n_way=5
  --data.episodes.n_query=5 --data.episodes.per_epoch=16 --data.batch_size=2
  --training.effective_batch_size=4 --training.epochs=2 --training.checkpoint_every=2
  --validation.episodes=20 --training.optimizer=adamw --training.momentum=0 --training.lr=0.003)
mpi -np 2 "$MEMTRAIN" train "${R[@]}" --output.dir=rfull >rfull.log 2>&1 || { cat rfull.log; fail "resume: full"; }
mpi -np 2 "$MEMTRAIN" train "${R[@]}" --output.dir=rpart --training.max_windows=3 >rpart1.log 2>&1 ||
  { cat rpart1.log; fail "resume: part 1"; }
mpi -np 1 "$MEMTRAIN" train "${R[@]}" --output.dir=rpart --resume=auto >rpart2.log 2>&1 ||
  { cat rpart2.log; fail "resume: part 2"; }
grep -q "resumed from rpart/checkpoints/ckpt-00000003.safetensors at step 3" rpart2.log ||
  { cat rpart2.log; fail "resume: no resume line"; }
"$PY" - <<'PYEOF' || fail "resume: records differ"
import json
def recs(d):
    keep = ("loss", "train_loss", "val_accuracy", "val_accuracy_ci95")
    return [[j.get(k) for k in keep] for j in map(json.loads, open(d + "/metrics.jsonl"))
            if j["type"] in ("window", "epoch")]
a, b = recs("rfull"), recs("rpart")
assert len(a) == len(b) == 10, (len(a), len(b))
for x, y in zip(a, b):
    assert all((u is None and v is None) or abs(u - v) < 1e-5 for u, v in zip(x, y)), (x, y)
print(f"resume: {len(a)} window and epoch records equal across a resume at another world size")
PYEOF
d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" rfull/model.safetensors rpart/model.safetensors)
"$PY" -c "import sys; sys.exit(0 if float(sys.argv[1])<1e-5 else 1)" "$d" || fail "resume: weights differ by $d"

# The CNN backbone on /images, with and without checkpointing its stages
# (FewShotModel forwards set_checkpointed): the same update.
"$MEMTRAIN" make-data --kind images --out img.h5 --classes 12 --samples 480 --height 8 --width 8
for ck in off all; do
  mpi -np 1 "$MEMTRAIN" train --data.train=img.h5 --model.name=cnn --model.hidden=8 \
    --model.head=prototype --data.episodes.n_way=3 --data.episodes.n_query=4 \
    --data.episodes.per_epoch=4 --data.batch_size=2 --training.effective_batch_size=4 \
    --training.gradient_checkpointing=$ck --training.max_windows=1 --validation.episodes=0 \
    --output.dir=cnn-$ck >cnn-$ck.log 2>&1 || { cat cnn-$ck.log; fail "cnn $ck"; }
done
d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" cnn-off/model.safetensors cnn-all/model.safetensors)
echo "cnn: max |w(off) - w(all checkpointed)| = $d"
"$PY" -c "import sys; sys.exit(0 if float(sys.argv[1])<1e-6 else 1)" "$d" || fail "cnn checkpointing"

# The class split: disjoint sets, in the banner and in episodes.json.
grep -q "48 training classes, 16 validation classes" prototype.log ||
  { cat prototype.log; fail "class split not reported"; }
"$PY" - prototype/episodes.json <<'PYEOF' || fail "episodes.json"
import json, sys
j = json.load(open(sys.argv[1]))
t, v = set(j["train_classes"]), set(j["val_classes"])
assert not t & v, t & v
assert t | v == set(range(64)) and len(v) == 16, (len(t), len(v))
print(f"episodes.json: {len(t)} training and {len(v)} validation classes, disjoint")
PYEOF

# A too-small class is named and refused before training.
"$MEMTRAIN" make-data --kind fewshot --out small.h5 --classes 10 --samples 100
if mpi -np 2 "$MEMTRAIN" train --data.train=small.h5 --data.episodes.n_way=3 \
  --model.head=prototype --data.episodes.n_query=15 --output.dir=small >small.log 2>&1; then
  fail "a class of 10 samples was accepted for k_shot + n_query = 16"
fi
grep -q "class 0 (a training class) has 10 sample(s), fewer than data.episodes.k_shot + n_query = 1 + 15 = 16" small.log ||
  { cat small.log; fail "the message does not name the class"; }

# The shipped config starts and runs one window (CPU, small data path).
mpi -np 1 "$MEMTRAIN" train --config "$ROOT/launch/configs/fewshot-features-v100.yaml" \
  --data.train=fs.h5 --training.max_windows=1 --dist.device=cpu \
  --output.dir=v100 >v100.log 2>&1 || { cat v100.log; fail "fewshot-features-v100.yaml"; }
[ "$(grep -c '"type":"window"' v100/metrics.jsonl)" = 1 ] || fail "fewshot-features-v100: not one window"
echo "e2e fewshot: ok"
