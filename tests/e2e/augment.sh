#!/usr/bin/env bash
# Issue 12's image path through the executable (docs/models.md "Images:
# augmentation, binary classification"):
# - the CNN on 3-channel uint8 images with data.augment=crop_flip and
#   data.normalize=imagenet, two epochs of 3 windows: 1 rank x 4
#   micro-steps x 8 (2 reader threads), 2 ranks x 4 x 4 and 1 rank x 1 x
#   32 read in place give the same model.safetensors (max abs difference
#   < 1e-5: each sample's crop and flip come from (data.seed, epoch,
#   index) alone); without augmentation the weights differ;
# - a binary MLP (model.num_classes=1, training.label_smoothing=0.1) at 2
#   ranks writes val_auc to the validation and epoch records,
#   metrics.csv's val_auc column and best.safetensors ranked by it; the
#   last validation's val_auc, val_accuracy and val_loss equal
#   binary_reference.py's recomputation from model.safetensors (PyTorch,
#   every pair counted); `memtrain eval` at 1 rank gives the same val_auc;
# - a validation file of one class: val_auc null and one warning;
# - bad inputs exit 2 naming the problem: labels outside {0, 1} for a
#   binary model (the row and the value), val_auc for a 4-class run,
#   imagenet on 1-channel images, crop_flip on features, a crop range the
#   wrong way round.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

TPY=""  # torch, h5py, numpy: the reference and a file make-data does not write
for c in "$PY" /usr/bin/python3; do
  if "$c" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then TPY=$c; break; fi
done
[ -n "$TPY" ] || echo "SKIP: the PyTorch reference and the one-class file below (no Python with torch, h5py and numpy)"

expect_fail() {  # NAME NP MESSAGE COMMAND-ARGS...: exit 2 and the message
  local name=$1 np=$2 pattern=$3
  shift 3
  local rc=0
  mpi -np "$np" "$MEMTRAIN" train "$@" --output.dir="$name" >"$name.log" 2>&1 || rc=$?
  [ $rc = 2 ] || { cat "$name.log"; fail "$name: exit $rc, expected 2"; }
  grep -qF -- "$pattern" "$name.log" || { cat "$name.log"; fail "$name: no '$pattern'"; }
  echo "$name: exit 2: $(grep -m1 'error' "$name.log" | cut -c1-220)"
}

# 1. Augmentation does not depend on the world size or the split.
"$MEMTRAIN" make-data --kind images --dtype uint8 --channels 3 --height 16 \
  --width 16 --samples 96 --seed 3 --out img.h5 >/dev/null
aug=(--model.name=cnn --model.hidden=8 --data.train=img.h5 --data.val=
  --data.augment=crop_flip --data.normalize=imagenet
  --data.crop_scale="[0.3, 1.0]" --training.effective_batch_size=32
  --training.epochs=2 --training.lr=0.2 --training.momentum=0)
run() {  # NAME NP MICRO [extra]
  mpi -np "$2" "$MEMTRAIN" train "${aug[@]}" --data.batch_size="$3" \
    --output.dir="$1" "${@:4}" >"$1.log" 2>&1 || { cat "$1.log"; fail "$1"; }
}
run a 1 8 --data.read_threads=2
run b 2 4
run c 1 32 --data.prefetch=0
run n 1 32 --data.augment=none
grep -q "augment crop_flip (scale \[0.3, 1\], ratio \[0.75, 1.33333\]), normalize imagenet" a.log ||
  { cat a.log; fail "banner: no augment line"; }
ab=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" a/model.safetensors b/model.safetensors)
ac=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" a/model.safetensors c/model.safetensors)
cn=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" c/model.safetensors n/model.safetensors)
echo "augmented: max |a-b| = $ab, max |a-c| = $ac; vs not augmented max |c-n| = $cn"
"$PY" -c "import sys; a,b,u=map(float,sys.argv[1:]); sys.exit(0 if a<1e-5 and b<1e-5 and u>1e-4 else 1)" \
  "$ab" "$ac" "$cn" || fail "augmented updates differ between splits (or augmentation did nothing)"

# 2. A binary classifier: val_auc, recomputed independently.
"$MEMTRAIN" make-data --kind features --classes 2 --samples 256 --seed 5 \
  --noise 2 --out bin.h5 >/dev/null
"$MEMTRAIN" make-data --kind features --classes 2 --samples 101 --seed 5 \
  --noise 2 --split val --out bin_val.h5 >/dev/null
bin=(--model.name=mlp --model.num_classes=1 --training.label_smoothing=0.1
  --data.train=bin.h5 --data.val=bin_val.h5 --data.batch_size=16
  --training.lr=0.05)
mpi -np 2 "$MEMTRAIN" train "${bin[@]}" --training.epochs=2 \
  --validation.best_metric=val_auc --output.dir=bin >bin.log 2>&1 ||
  { cat bin.log; fail "binary run"; }
grep -q "1 logit: binary" bin.log || { cat bin.log; fail "banner: not binary"; }
grep -q "val AUC" bin.log || { cat bin.log; fail "no val AUC on the console"; }
if [ -n "$TPY" ]; then
  "$TPY" "$PEER_SCRIPTS/binary_reference.py" bin_val.h5 bin/model.safetensors 64 2 0.1 >ref.json ||
    fail "binary_reference.py"
fi
"$PY" - "$PEER_SCRIPTS" <<'EOF' || fail "binary records"
import csv, json, sys
sys.path.insert(0, sys.argv[1])
import safetensors_read
recs = [json.loads(l) for l in open("bin/metrics.jsonl")]
vals = [r for r in recs if r["type"] == "validation"]
epochs = [r for r in recs if r["type"] == "epoch"]
assert len(vals) == 2 and len(epochs) == 2, (len(vals), len(epochs))
for v, e in zip(vals, epochs):
    assert 0.0 <= v["val_auc"] <= 1.0, v
    assert e["val_auc"] == v["val_auc"], (e, v)
rows = list(csv.DictReader(open("bin/metrics.csv")))
filled = [r for r in rows if r["val_auc"] != ""]
assert [float(r["val_auc"]) for r in filled] == [v["val_auc"] for v in vals], filled
last = vals[-1]
print("last validation:", {k: last[k] for k in ("val_auc", "val_accuracy", "val_loss")})
try:
    ref = json.load(open("ref.json"))
except FileNotFoundError:
    ref = None
    print("reference      : skipped")
if ref is not None:
    print("reference      :", ref)
    assert abs(last["val_auc"] - ref["val_auc"]) < 1e-9, "val_auc"
    assert abs(last["val_accuracy"] - ref["val_accuracy"]) < 1e-12, "val_accuracy"
    assert abs(last["val_loss"] - ref["val_loss"]) < 1e-5 * abs(ref["val_loss"]), "val_loss"
best = [v for v in vals if v.get("best")]
_, meta = safetensors_read.load("bin/best.safetensors")
assert meta["best_metric"] == "val_auc", meta
assert float(meta["best_value"]) == max(v["val_auc"] for v in vals), (meta, vals)
print("ok: val_auc in the records, the CSV and best.safetensors" + ("; = the reference" if ref else ""))
EOF
mpi -np 1 "$MEMTRAIN" eval "${bin[@]}" --output.dir=bin --weights bin/model.safetensors \
  >eval.log 2>&1 || { cat eval.log; fail "eval"; }
"$PY" - <<'EOF' || fail "eval's val_auc"
import json
e = json.loads([l for l in open("eval.log") if '"type":"eval"' in l][-1])
v = [json.loads(l) for l in open("bin/metrics.jsonl") if '"validation"' in l][-1]
print("eval at 1 rank: val_auc", e["val_auc"], "; the 2-rank run's:", v["val_auc"])
assert abs(e["val_auc"] - v["val_auc"]) < 1e-9
EOF

# 3. A validation file of one class: val_auc is null, one warning.
if [ -n "$TPY" ]; then
  "$TPY" - <<'EOF'
import h5py, numpy as np
with h5py.File("bin_val.h5", "r") as f, h5py.File("one.h5", "w") as g:
    g["features"] = f["features"][...]
    g["labels"] = np.zeros(f["labels"].shape, np.int64)
EOF
  mpi -np 2 "$MEMTRAIN" train "${bin[@]}" --data.val=one.h5 --training.epochs=2 \
    --output.dir=one >one.log 2>&1 || { cat one.log; fail "one-class run"; }
  [ "$(grep -c "warning: val_auc is undefined" one.log)" = 1 ] || { cat one.log; fail "one warning"; }
  "$PY" -c '
import json
v = [json.loads(l) for l in open("one/metrics.jsonl") if "\"validation\"" in l]
assert len(v) == 2 and all(r["val_auc"] is None for r in v), v
' || fail "one-class val_auc not null"
  echo "one class: val_auc null, warned once"
fi

# 4. Bad inputs.
"$MEMTRAIN" make-data --kind features --classes 4 --samples 64 --out four.h5 >/dev/null
"$MEMTRAIN" make-data --kind images --channels 1 --height 8 --width 8 \
  --samples 16 --out gray.h5 >/dev/null
expect_fail bad-labels 2 "but model.num_classes=1 (a binary classifier) needs labels 0 and 1 only" \
  --data.train=four.h5 --data.val= --model.num_classes=1
grep -qE "row [0-9]+ has label [23]," bad-labels.log || fail "bad-labels: row and value"
expect_fail bad-auc 1 "validation.best_metric=val_auc: this run reports val_accuracy (a classifier; val_auc needs a binary one" \
  --data.train=four.h5 --data.val=four.h5 --validation.best_metric=val_auc
expect_fail bad-gray 2 "data.normalize=imagenet needs 3-channel (RGB) images, but the images of data.train 'gray.h5' have 1 channel(s)" \
  --data.train=gray.h5 --data.val= --model.name=cnn --data.normalize=imagenet
expect_fail bad-features 1 "data.augment=crop_flip applies to /images files, but data.train 'four.h5' holds features" \
  --data.train=four.h5 --data.val= --data.augment=crop_flip
expect_fail bad-range 1 "data.crop_scale = '[0.9, 0.1]' (command line): lo is above hi" \
  --data.train=four.h5 --data.crop_scale="[0.9, 0.1]"
echo "e2e augment: ok"
