#!/usr/bin/env bash
# Whole-volume validation against MONAI itself (issue 34): a 3D U-Net that
# memtrain trained (2 ranks), its weights loaded into the same network in
# PyTorch (benchmarks/vs_pytorch/race_models.py), MONAI's
# sliding_window_inference and DiceMetric (tests/peers/monai_reference.py) on
# ragged validation cases: cases smaller than the roi on one or two axes
# (odd and even padding), one larger than the roi, one whose labels lack a
# class. For both blend modes and two overlaps, memtrain's `eval` record
# must give every case's Dice per class as MONAI's (within 1e-6), val_dice
# as DiceMetric's mean and the loss within 1e-6 relative; the training
# run's own validation record and its val/epoch-EEE/summary.json too; and
# weights trained further in PyTorch with MONAI's DiceCELoss, and MONAI's own
# SwinUNETR trained so (model.name=swin_unetr). padding=end (the old rule)
# must differ.
# Python: the torch venv (torch 2.11, MONAI, h5py, numpy:
# launch/install_peers.sh installs MONAI there).
source "$(dirname "$0")/common.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
MPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
"$MPY" -c 'import monai, h5py, numpy, torch' >/dev/null 2>&1 ||
  fail "no MONAI in $MPY: run bash launch/install_peers.sh (it installs MONAI into the torch venv)"

K=3
"$MEMTRAIN" make-data --kind volumes --out train.h5 --samples 4 --channels 1 \
  --depth 32 --height 32 --width 32 --classes $K --noise 0.7 --split train >/dev/null ||
  fail "make-data train"
"$MEMTRAIN" make-data --kind volumes --out src.h5 --samples 5 --channels 1 \
  --depth 32 --height 32 --width 32 --classes $K --noise 0.7 --split val >/dev/null ||
  fail "make-data val"
# roi 16: case_0 and case_1 are smaller on some axes (padding 7 = 3 + 4,
# 4 = 2 + 2, 1 = 0 + 1), case_2 is larger everywhere, case_4 lacks class 2.
"$MPY" "$PEER_SCRIPTS/monai_reference.py" make-val src.h5 val.h5 \
  "9,20,31;30,12,15;23,27,29;16,16,16;25,21,18" || fail "make-val"

UNET=(--model.name=unet3d --model.feature_size=8 --model.depth=3 --model.norm=instance
      --data.patch_size=16 --data.val=val.h5)
timeout 600 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train "${UNET[@]}" \
  --data.train=train.h5 --data.batch_size=4 --data.patches_per_volume=16 \
  --training.optimizer=adamw --training.lr=0.003 --training.epochs=3 \
  --validation.every_epochs=3 --output.dir=run >train.log 2>&1 ||
  { tail -30 train.log; fail "train"; }

check() {  # NAME RECORD BLEND OVERLAP
  "$MPY" "$PEER_SCRIPTS/monai_reference.py" check val.h5 "${MONAI_WEIGHTS:-run/model.safetensors}" \
    "${NET:-unet,8,3,instance}" "${ROI:-16,16,16}" "$4" "$3" "$2" >"$1.txt" 2>&1 || { cat "$1.txt"; fail "$1: memtrain and MONAI differ"; }
  tail -1 "$1.txt"
}

# The training run's validation (gaussian, overlap 0.25: the defaults), its
# record and its summary.json.
grep '"type":"validation"' run/metrics.jsonl | tail -1 >val_record.json
check trained val_record.json gaussian 0.25
"$PY" - <<'PYEOF' || fail "run/val/epoch-003/summary.json"
import json, math
rec = json.load(open("val_record.json"))
s = json.load(open("run/val/epoch-003/summary.json"))
cases = [c["case"] for c in rec["val_cases"]]
assert cases == [f"case_{i}" for i in range(5)], cases
assert [c["case"] for c in s["metric_per_case"]] == cases
for c, p in zip(rec["val_cases"], s["metric_per_case"]):
    for k, d in c["dice"].items():
        m = p["metrics"][k]
        assert (d is None and m["Dice"] is None) or d == m["Dice"], (c["case"], k, d, m)
        if m["n_ref"] > 0:
            assert abs(m["Dice"] - 2 * m["TP"] / (2 * m["TP"] + m["FP"] + m["FN"])) < 1e-12
# case_4 lacks class 2: no Dice there (ignore_empty), whatever it predicts.
assert rec["val_cases"][4]["dice"]["2"] is None, rec["val_cases"][4]
assert s["metric_per_case"][4]["metrics"]["2"]["n_ref"] == 0
assert abs(s["case_mean"]["Dice"] - rec["val_dice"]) < 1e-12
print("summary.json: 5 cases, as the record")
PYEOF

# memtrain eval, one rank: both blend modes, two overlaps.
for blend in gaussian constant; do
  for overlap in 0.25 0.6; do
    name=eval-$blend-$overlap
    "$MEMTRAIN" eval "${UNET[@]}" --data.train=train.h5 --output.dir=run \
      --validation.blend=$blend --validation.overlap=$overlap \
      --weights run/model.safetensors >$name.log 2>&1 || { cat $name.log; fail "$name"; }
    grep '"type":"eval"' $name.log >$name.json
    check $name $name.json $blend $overlap
  done
done
# Weights trained in PyTorch with MONAI's loss, validated by memtrain (eval)
# and by MONAI: the same figures.
"$MPY" "$PEER_SCRIPTS/monai_reference.py" finetune train.h5 run/model.safetensors \
  unet,8,3,instance monai.safetensors 16,16,16 || fail "finetune in PyTorch"
"$MEMTRAIN" eval "${UNET[@]}" --data.train=train.h5 --output.dir=run \
  --weights monai.safetensors >eval-monai.log 2>&1 || { cat eval-monai.log; fail "eval of MONAI's weights"; }
grep '"type":"eval"' eval-monai.log >eval-monai.json
MONAI_WEIGHTS=monai.safetensors check eval-monai eval-monai.json gaussian 0.25

# MONAI's own SwinUNETR trained in PyTorch with MONAI's loss, validated by
# memtrain (model.name=swin_unetr, eval) and by MONAI: the same figures.
# Its roi is 32x32x64 (multiples of 32): every case is smaller and padded.
"$MEMTRAIN" make-data --kind volumes --out train64.h5 --samples 2 --channels 1 \
  --depth 32 --height 32 --width 64 --classes $K --noise 0.7 --split train >/dev/null ||
  fail "make-data train64"
"$MPY" "$PEER_SCRIPTS/monai_reference.py" finetune train64.h5 - swin,12 swin.safetensors 32,32,64 ||
  fail "SwinUNETR in PyTorch"
"$MEMTRAIN" eval --model.name=swin_unetr --model.feature_size=12 --data.train=train64.h5 \
  --data.val=val.h5 --data.patch_size=[32,32,64] --output.dir=run \
  --weights swin.safetensors >eval-swin.log 2>&1 || { cat eval-swin.log; fail "eval of MONAI's SwinUNETR"; }
grep '"type":"eval"' eval-swin.log >eval-swin.json
NET=swin,12 ROI=32,32,64 MONAI_WEIGHTS=swin.safetensors check eval-swin eval-swin.json gaussian 0.25

# The comparison has teeth: validation.padding=end (memtrain's rule before
# issue 34) must differ from MONAI on the cases smaller than the roi.
"$MEMTRAIN" eval "${UNET[@]}" --data.train=train.h5 --output.dir=run \
  --validation.padding=end --weights run/model.safetensors >end.log 2>&1 ||
  { cat end.log; fail "eval with padding end"; }
grep '"type":"eval"' end.log >end.json
if "$MPY" "$PEER_SCRIPTS/monai_reference.py" check val.h5 run/model.safetensors unet,8,3,instance \
  16,16,16 0.25 gaussian end.json >end.txt 2>&1; then
  cat end.txt; fail "padding=end agrees with MONAI: the comparison cannot tell paddings apart"
fi
grep -q "MISMATCH case_0" end.txt || { cat end.txt; fail "padding=end: case_0 should differ"; }
echo "padding=end differs from MONAI, as it must: $(grep -c MISMATCH end.txt) mismatches"
# Resuming with another padding: val_dice means something else, so
# best.safetensors ranks anew (and says why).
timeout 600 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train "${UNET[@]}" \
  --data.train=train.h5 --data.batch_size=4 --data.patches_per_volume=16 \
  --training.optimizer=adamw --training.lr=0.003 --training.epochs=4 \
  --validation.every_epochs=3 --output.dir=run --resume auto \
  --validation.padding=end >resume.log 2>&1 || { tail -30 resume.log; fail "resume"; }
grep -q "best.safetensors ranks anew: validation.padding is not the checkpoint's" resume.log ||
  { grep -i resumed resume.log; fail "resume with another padding kept the old best"; }
echo "PASS monai_validation"
