#!/usr/bin/env bash
# model.context (issue 54, points 5 and 6; input/context_crop.h,
# nets/dinov3_seg.h): the tiny DINOv3 from timm's own file runs twice per
# patch, on its slices and on a crop twice as wide around them, and a
# trained head takes both.
# 1. concat at 2 ranks with flips: the crop's size is said once; the loss
#    falls; only the head moved and the backbone is the file's, bit for
#    bit; every window records the backbone's and the context's extraction
#    peaks apart, the context's above the backbone's (it runs beside the
#    patch's features) and both within the window's peak; validation runs
#    the same two extractions per window of each whole volume: per-case
#    Dice in the record and in val/epoch-006/summary.json, the validation's
#    own extraction peaks in its record.
# 2. What is all-reduced is the head: concat sends exactly the 4 x 64 x 3
#    floats of its wider head more than the run without context, add
#    exactly its 2 x 4 x 64 fusion weights more.
# 3. Refusals, exit 2, one line: a scale of 1 or below, and a context for
#    a model that takes none.
# 4. memtrain predict runs both extractions per window: the tiny DINOv3
#    with a concat context, trained 6 epochs on the brain-mask task (3 mm,
#    data/make_brain_dataset.sh), segments the whole ch2 template at 1 mm
#    on 2 ranks (its head takes both maps: a predictor without the context
#    would be refused); the label map has the case's shape, classes {0, 1},
#    and Dice >= 0.6 against ch2bet (0.741 measured; training's own
#    validation Dice 0.638).
# Python: the torch venv (torch 2.11, timm: launch/install_peers.sh).
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/common.sh"
OPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
"$OPY" -c 'import timm, safetensors, torch' >/dev/null 2>&1 ||
  fail "no timm in $OPY: run bash launch/install_peers.sh (it installs timm into the torch venv)"

for split in train val; do
  "$MEMTRAIN" make-data --kind volumes --out $split.h5 --samples 4 --channels 1 \
    --depth 16 --height 32 --width 32 --classes 3 --noise 0.5 --split $split \
    --chunk 4 >/dev/null || fail "make-data $split"
done
mkdir -p tiny
"$OPY" "$PEER_SCRIPTS/dinov3_reference.py" make tiny tiny 7 || fail "timm side (tiny)"
common=(--data.train=train.h5 --data.val=val.h5 --model.name=dinov3 --model.variant=tiny
  --model.pretrained=tiny/timm.pth --data.patch_size=[4,32,32] --data.batch_size=2
  --training.effective_batch_size=4 --data.patches_per_volume=2
  --training.optimizer=adamw --training.lr=0.01)

# 1. concat, 2 ranks, flips.
train_common 2 concat --model.context.scale=2 --training.epochs=6 --validation.every_epochs=3 \
  --data.flip=all --output.save_initial=true
said=$(grep -c "each patch's context crop is 4x64x64 voxels around its centre" concat.log || true)
[ "$said" = 1 ] || { cat concat.log; fail "the context crop's size is said $said times, not once"; }
"$OPY" - concat tiny/timm.pth <<'EOF' || fail "concat: see above"
import json, sys, torch, safetensors.torch as st
out, src = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
wins = [r for r in rows if r["type"] == "window"]
vals = [r for r in rows if r["type"] == "validation"]
first, last = wins[0]["loss"], wins[-1]["loss"]
assert last < 0.8 * first, f"the loss did not fall: {first} -> {last}"
for w in wins:
    b, c = w["mem_peak_backbone"], w["mem_peak_context"]
    assert 0 < b < c <= w["mem_peak"], (w["step"], b, c, w["mem_peak"])
assert len(vals) == 2, vals
for v in vals:
    assert [c["case"] for c in v["val_cases"]] == [str(i) for i in range(4)], v["val_cases"]
    assert 0 < v["val_mem_peak_backbone"] < v["val_mem_peak_context"], v
s = json.load(open(f"{out}/val/epoch-006/summary.json"))
assert [c["case"] for c in s["metric_per_case"]] == [c["case"] for c in vals[-1]["val_cases"]]
assert abs(s["case_mean"]["Dice"] - vals[-1]["val_dice"]) < 1e-12
fin, ini = st.load_file(f"{out}/model.safetensors"), st.load_file(f"{out}/initial.safetensors")
timm = torch.load(src)
assert torch.equal(fin["backbone.blocks.3.mlp.fc2.weight"], timm["blocks.3.mlp.fc2.weight"])
moved = [k for k in fin if not torch.equal(fin[k], ini[k])]
assert sorted(moved) == ["head.bias", "head.weight"], moved
assert fin["head.weight"].shape == (3, 2 * 4 * 64, 1, 1), fin["head.weight"].shape
w = wins[-1]
print(f"concat: {len(wins)} windows, loss {first:.4f} -> {last:.4f}; peaks backbone "
      f"{w['mem_peak_backbone']} B, context {w['mem_peak_context']} B, window {w['mem_peak']} B; "
      f"val_dice {vals[-1]['val_dice']:.3f} over {len(vals[-1]['val_cases'])} cases")
EOF

# 2. The all-reduce: no context, concat, add.
train_common 2 plain --training.max_windows=2
train_common 2 add --training.max_windows=2 --model.context.scale=2 --model.context.fusion=add
train_common 2 concat2 --training.max_windows=2 --model.context.scale=2
"$PY" - <<'EOF' || fail "the all-reduce is not the head's gradient"
import json
def sent(d):
    s = {json.loads(l)["allreduce_bytes"] for l in open(f"{d}/metrics.jsonl") if '"window"' in l}
    assert len(s) == 1, (d, s)
    return s.pop()
plain, add, concat = sent("plain"), sent("add"), sent("concat2")
assert concat - plain == 4 * (4 * 64 * 3), (plain, concat)
assert add - plain == 4 * (2 * 4 * 64), (plain, add)
print(f"all-reduced a window: {plain} B without context, {concat} B concat, {add} B add")
EOF

# 3. Refusals.
refused_common one "model.context.scale=1: the context crop must be larger than the patch" \
  --model.context.scale=1
refused_common half "model.context.scale=0.5: the context crop must be larger than the patch" \
  --model.context.scale=0.5
refused_common unet "model.name=unet3d takes none: set model.context.scale=0" \
  --model.name=unet3d --model.pretrained= --model.context.scale=2
# 4. predict with context.
T=/usr/share/mricron/templates
[ -f $T/ch2.nii.gz ] || fail "mricron-data is not installed (bash launch/install_deps.sh)"
MEMTRAIN=$MEMTRAIN "$ROOT/data/make_brain_dataset.sh" brain 3 >/dev/null 2>brain.log ||
  { cat brain.log; fail "make_brain_dataset.sh"; }
bcfg=(--data.train=brain/brain-train.h5 --data.val=brain/brain-val.h5 --model.name=dinov3
  --model.variant=tiny --model.context.scale=2 --data.patch_size=[16,32,32]
  --data.patches_per_volume=16 --data.batch_size=4 --training.effective_batch_size=8
  --training.optimizer=adamw --training.lr=0.01 --validation.roi=[16,32,32])
timeout 300 "$MEMTRAIN" train "${bcfg[@]}" --training.epochs=6 --validation.every_epochs=6 \
  --output.dir=brain_run >brain_run.log 2>&1 || { tail -20 brain_run.log; fail "brain training"; }
mkdir -p cases labels
cp $T/ch2.nii.gz cases/a.nii.gz
cp $T/ch2bet.nii.gz labels/a.nii.gz
timeout 300 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" predict "${bcfg[@]}" \
  --weights brain_run/model.safetensors --input cases --labels labels --label-map '>0:1' \
  --out pred >predict.log 2>&1 || { cat predict.log; fail "predict with context"; }
/usr/bin/python3 - <<'PY' || fail "4: see above"
import csv, numpy as np, nibabel as nib
out, ref = nib.load("pred/a.nii.gz"), nib.load("cases/a.nii.gz")
assert out.shape == ref.shape, (out.shape, ref.shape)
assert set(np.unique(np.asarray(out.dataobj))) <= {0, 1}
rows = list(csv.DictReader(open("pred/metrics.csv")))
dice = float(rows[0]["dice"])
assert len(rows) == 1 and dice >= 0.6, rows
print(f"predict with context: ch2 {out.shape}, brain Dice {dice:.3f}")
PY
echo "dinov3_context: passed"
