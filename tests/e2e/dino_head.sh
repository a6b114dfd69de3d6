#!/usr/bin/env bash
# Heads on frozen-backbone features with per-volume validation (Note
# [Volume rows], docs/data-format.md "Rows that belong to volumes"):
# 1. make-data --kind patch-features (6 training volumes, 4 validation
#    volumes with their rows shuffled, grid 6); inspect names the volumes.
# 2. 2 ranks, 2 epochs, --validation.dump_predictions=true: one prediction
#    file per volume per epoch; tests/peers/volume_dice.py (h5py, numpy)
#    recomputes every volume's Dice, the per-class Dice, val_dice (the
#    volumes' mean, as MONAI's DiceMetric) and the accuracy from the dumped
#    grids and the validation file, and finds metrics.jsonl's values and
#    summary.json's within 1e-9; metrics.csv has
#    the Dice columns.
# 3. Validation's device peak (val_device_peak) is the same with 2 and 8
#    validation volumes, and grows with the validation batch.
# 4. dump_predictions on a file without volume rows is refused (exit 2).
# 5. launch/configs/dino-head.yaml runs one epoch on small data.
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/common.sh"

# h5py and numpy for the independent reader: $PY if it has them, else
# Debian's python3.
HPY=""
for c in "$PY" /usr/bin/python3; do
  if "$c" -c 'import h5py, numpy' >/dev/null 2>&1; then HPY=$c; break; fi
done
recompute() {  # VAL_H5 RUN_DIR
  if [ -n "$HPY" ]; then
    "$HPY" "$PEER_SCRIPTS/volume_dice.py" "$1" "$2" --tol 1e-9 ||
      fail "$2: per-volume Dice recomputed from the dumps differs"
  else
    echo "SKIP: no python3 with h5py and numpy for tests/peers/volume_dice.py"
  fi
}
mk() {  # OUT VOLUMES SPLIT [ARGS...]
  local out=$1 v=$2 split=$3
  shift 3
  "$MEMTRAIN" make-data --kind patch-features --volumes "$v" --grid 6 \
    --features 16 --context 8 --noise 1.5 --seed 3 --split "$split" \
    --out "$out" "$@" >/dev/null || fail "make-data $out"
}
train() {  # NP NAME ARGS...: a run that must succeed
  local np=$1 name=$2
  shift 2
  local rc=0
  timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$MEMTRAIN" train \
    --model.hidden=32 --data.batch_size=16 --training.optimizer=adamw \
    --training.momentum=0 --training.lr=0.003 --output.dir="$name" "$@" \
    >"$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { tail -30 "$name.log"; fail "$name: exit status $rc"; }
}

# 1. The data.
mk train.h5 6 train
mk val.h5 4 val --shuffle
mk val2.h5 2 val
mk val8.h5 8 val
"$MEMTRAIN" inspect val.h5 >inspect.txt || { cat inspect.txt; fail "inspect val.h5"; }
grep -q "^volume rows: 4 volume(s) (ids 0..3), grid(s) 6x6x6 (4)$" inspect.txt ||
  { cat inspect.txt; fail "inspect does not name the volumes"; }

# 2. Two ranks, two epochs, dumps recomputed independently.
train 2 fit --data.train=train.h5 --data.val=val.h5 --training.epochs=2 \
  --validation.dump_predictions=true
for e in 001 002; do
  n=$(ls fit/val/epoch-$e | grep -c '^volume-[0-3]\.h5$' || true)
  [ "$n" = 4 ] || { ls -R fit/val; fail "epoch $e: $n of 4 prediction files"; }
done
recompute val.h5 fit
"$PY" - <<'PYEOF' || fail "fit: records"
import csv, json
val = [j for j in map(json.loads, open("fit/metrics.jsonl")) if j["type"] == "validation"]
assert len(val) == 2, len(val)
for j in val:
    assert [c["case"] for c in j["val_cases"]] == ["0", "1", "2", "3"], j["val_cases"]
    assert j["val_volumes"] == 4 and j["val_samples"] == 4 * 216, j
    assert 0 < j["val_dice"] <= 1 and 0 < j["val_accuracy"] <= 1, j
rows = list(csv.DictReader(open("fit/metrics.csv")))
last = [r for r in rows if r["val_dice"]]
assert len(last) == 2 and "val_dice_blob1" in rows[0], rows[0].keys()
assert abs(float(last[-1]["val_dice"]) - val[-1]["val_dice"]) < 1e-9
print("fit: val_dice by epoch", [round(j["val_dice"], 4) for j in val],
      "; per volume", {c["case"]: c["mean"] for c in val[-1]["val_cases"]})
PYEOF

# 3. The device holds one validation batch, whatever the number of volumes.
peak() {  # RUN: rank 0's val_device_peak of its one validation
  "$PY" -c 'import json,sys
v=[j for j in map(json.loads,open(sys.argv[1]+"/metrics.jsonl")) if j["type"]=="validation"]
print(v[0]["val_device_peak"])' "$1"
}
train 2 v2 --data.train=train.h5 --data.val=val2.h5 --data.val_batch_size=32
train 2 v8 --data.train=train.h5 --data.val=val8.h5 --data.val_batch_size=32
train 2 v8b --data.train=train.h5 --data.val=val8.h5 --data.val_batch_size=200
p2=$(peak v2) p8=$(peak v8) p8b=$(peak v8b)
echo "val_device_peak: 2 volumes $p2 B, 8 volumes $p8 B (batch 32); 8 volumes, batch 200: $p8b B"
[ "$p2" = "$p8" ] || fail "validation's device peak grew with the volumes: $p2 -> $p8"
[ "$p8b" -gt "$p8" ] || fail "a 200-row validation batch did not raise the peak ($p8b vs $p8)"

# 4. A dump needs rows that belong to volumes.
"$MEMTRAIN" make-data --kind features --features 16 --context 8 --classes 2 --out plain.h5 >/dev/null
rc=0
"$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --data.train=train.h5 --data.val=plain.h5 \
  --validation.dump_predictions=true --output.dir=refused >refused.log 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat refused.log; fail "dump without volume rows: exit $rc, want 2"; }
grep -q "validation.dump_predictions=true needs data.val with rows that belong to volumes.*'plain.h5' has none" refused.log ||
  { cat refused.log; fail "dump without volume rows: no message"; }

# 5. The shipped config, on small data (paths and sizes overridden).
rc=0
timeout 300 "$MPIEXEC" --oversubscribe -np 1 "$MEMTRAIN" train --config "$ROOT/launch/configs/dino-head.yaml" \
  --data.train=train.h5 --data.val=val.h5 --training.epochs=1 --dist.device=cpu \
  --output.dir=yaml >yaml.log 2>&1 || rc=$?
[ "$rc" = 0 ] || { cat yaml.log; fail "dino-head.yaml: exit $rc"; }
grep -q "memory plan: budget v100-16gb" yaml.log || { cat yaml.log; fail "dino-head.yaml: no plan"; }
[ "$(grep -c '"type":"window"' yaml/metrics.jsonl)" -ge 1 ] || fail "dino-head.yaml: no window"
[ "$(grep -c '"val_cases"' yaml/metrics.jsonl)" = 1 ] || fail "dino-head.yaml: no per-volume validation"
recompute val.h5 yaml
echo "e2e dino_head: ok"
