#!/usr/bin/env bash
# The main job: install what is missing, build memtrain, build the brain-mask
# dataset from Debian's mricron-data (Colin27 T1, 3 mm), train the 3D U-Net
# with 2 MPI ranks under a 40 MiB memory budget (data.batch_size: auto,
# checkpointing auto, whole-slab validation with host-memory sums:
# launch/configs/quickstart.yaml), then predict the brain mask of the whole
# head on its own 1 mm grid as NIfTI and score it against ch2bet.
# Everything goes to runs/quickstart (replaced on each run); extra
# arguments are config overrides for the training (--training.epochs=60).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install_deps.sh
bash launch/build.sh --target memtrain
source launch/env.sh
templates=/usr/share/mricron/templates
MEMTRAIN=build/memtrain data/make_brain_dataset.sh runs/data/brain 3 >/dev/null
out=runs/quickstart
start=$SECONDS
bash launch/run.sh -np 2 --config launch/configs/quickstart.yaml \
  --output.dir=$out --output.overwrite=true "$@"
rm -rf "$out/predict"
memtrain_binding 2
mpirun -np 2 "${MEMTRAIN_BINDING[@]}" build/memtrain predict \
  --config launch/configs/quickstart.yaml --weights "$out/best.safetensors" \
  --input "$templates/ch2.nii.gz" --labels "$templates/ch2bet.nii.gz" \
  --label-map '>0:1' --out "$out/predict"
python3 - "$out" $((SECONDS - start)) <<'PY'
import csv, json, sys
out, took = sys.argv[1], sys.argv[2]
val = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if '"validation"' in l]
best = max(val, key=lambda r: r["val_dice"])
row = next(csv.DictReader(open(f"{out}/predict/metrics.csv")))
print(f"quickstart: {took} s of training and prediction on 2 ranks")
print(f"  validation Dice (right-lateral 30% slab, 3 mm, whole by sliding window): "
      f"{best['val_dice']:.4f} at epoch {best['epoch'] + 1}")
print(f"  predicted brain mask of the whole head, 1 mm: Dice {float(row['dice']):.4f}, "
      f"HD95 {float(row['hd95_mm']):.1f} mm against ch2bet")
print(f"  files: {out}/predict/ch2.nii.gz (the mask, ch2.nii.gz's grid and affine), "
      f"{out}/progress.png, {out}/metrics.jsonl, {out}/memory_plan.json")
PY
