#!/usr/bin/env bash
# The brain-mask task as docs/models.md ("Volumes") runs it: data/make_brain_dataset.sh
# builds the Colin27 files (3 mm), then 2 ranks train
# launch/configs/brain_mask.yaml unchanged (only the paths overridden).
# The last validation's Dice must reach 0.90 (0.947 measured at epoch 60);
# every validation reports 2 classes and the same device peak (the same
# volume, sliding window on the device, sums in host memory).
# Then the same task with model.name=swin_unetr (MONAI's SwinUNETR,
# feature size 12, 32x64x32 patches and roi, lr 0.001, 10 epochs): its
# last validation's Dice must reach SWIN_FLOOR (docs/models.md "SwinUNETR" has the
# measured value; predicting the whole slab as brain scores 0.237: 13.5%
# of its voxels are brain).
REPO=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/common.sh"
[ -f /usr/share/mricron/templates/ch2.nii.gz ] ||
  fail "mricron-data is not installed (apt-get install mricron-data)"

MEMTRAIN=$MEMTRAIN "$REPO/data/make_brain_dataset.sh" data 3 >paths.txt 2>make.log ||
  { cat make.log; fail "data/make_brain_dataset.sh"; }
TRAIN=$(sed -n 1p paths.txt)
VAL=$(sed -n 2p paths.txt)
[ -f "$TRAIN" ] && [ -f "$VAL" ] || { cat paths.txt make.log; fail "no brain-train/val.h5"; }
echo "data: $TRAIN, $VAL"

start=$SECONDS
rc=0
timeout 800 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train \
  --config "$REPO/launch/configs/brain_mask.yaml" \
  --data.train="$TRAIN" --data.val="$VAL" --output.dir=run >train.log 2>&1 || rc=$?
took=$((SECONDS - start))
[ "$rc" = 0 ] || { tail -40 train.log; fail "training: exit status $rc after ${took} s"; }
echo "training: 2 ranks, ${took} s wall"

"$PY" - run/metrics.jsonl <<'PYEOF' || fail "brain_mask validation"
import json, sys
val = [json.loads(l) for l in open(sys.argv[1]) if '"validation"' in l]
assert val, "no validation record"
for r in val:
    print(f"  epoch {r['epoch'] + 1:3d}: val_dice {r['val_dice']:.4f} "
          f"per class {[round(d, 4) for d in r['val_dice_per_class']]} "
          f"val_device_peak {r['val_device_peak']} B, {r['val_seconds']:.2f} s")
    assert len(r["val_dice_per_class"]) == 2, r["val_dice_per_class"]
peaks = {r["val_device_peak"] for r in val}
assert len(peaks) == 1, f"val_device_peak differs between validations: {sorted(peaks)}"
assert val[-1]["epoch"] + 1 == 60, f"last validation after epoch {val[-1]['epoch'] + 1}, want 60"
last = val[-1]["val_dice"]
assert last >= 0.90, f"last val_dice {last:.4f} < 0.90"
print(f"last val_dice {last:.4f} >= 0.90; val_device_peak {peaks.pop()} B at every validation")
PYEOF

SWIN_FLOOR=0.85
start=$SECONDS
rc=0
timeout 800 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train \
  --config "$REPO/launch/configs/brain_mask.yaml" \
  --data.train="$TRAIN" --data.val="$VAL" --model.name=swin_unetr \
  --model.feature_size=12 --data.patch_size=[32,64,32] \
  --validation.roi=[32,64,32] --training.lr=0.001 --training.epochs=10 \
  --output.dir=swin >swin.log 2>&1 || rc=$?
took=$((SECONDS - start))
[ "$rc" = 0 ] || { tail -40 swin.log; fail "swin_unetr training: exit status $rc after ${took} s"; }
"$PY" - swin/metrics.jsonl "$SWIN_FLOOR" "$took" <<'PYEOF' || fail "brain_mask swin_unetr validation"
import json, sys
val = [json.loads(l) for l in open(sys.argv[1]) if '"validation"' in l]
assert [r["epoch"] + 1 for r in val] == [5, 10], [r["epoch"] + 1 for r in val]
for r in val:
    print(f"  swin_unetr epoch {r['epoch'] + 1:3d}: val_dice {r['val_dice']:.4f}")
last, floor = val[-1]["val_dice"], float(sys.argv[2])
assert last >= floor, f"swin_unetr: last val_dice {last:.4f} < {floor}"
print(f"swin_unetr: last val_dice {last:.4f} >= {floor} in {sys.argv[3]} s (2 ranks)")
PYEOF
echo "e2e brain_mask: ok"
