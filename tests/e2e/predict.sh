#!/usr/bin/env bash
# memtrain predict: a U-Net trained briefly on the brain-mask task
# (launch/configs/quickstart.yaml, 2 ranks) segments a folder of two cases
# on 2 ranks: ch2 as it is (1 mm, 181x217x181) and ch2 cropped to
# 161x197x171 and flipped along x (its affine flipped with it, so the same
# world), each with its reference mask (ch2bet > 0, the same crop and flip).
# Checked with nibabel and scipy, independent readers:
# - each output is the input's shape and affine, uint8, classes {0, 1};
# - metrics.csv's Dice and HD95 equal a recomputation (scipy's EDT; MONAI's
#   definition) to 1e-5 and 1e-3 mm; both cases' Dice >= 0.8 (a crop
#   shifts the resampled grid, so the two masks are not voxel for voxel
#   the same);
# - bad input: a non-NIfTI --input and a missing --weights exit 2 naming
#   them, and leave an existing output as it was.
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/common.sh"
T=/usr/share/mricron/templates
[ -f $T/ch2.nii.gz ] || fail "mricron-data is not installed"
/usr/bin/python3 -c 'import nibabel, scipy' 2>/dev/null ||
  fail "python3-nibabel and python3-scipy are needed (bash launch/install_deps.sh)"

MEMTRAIN=$MEMTRAIN "$ROOT/data/make_brain_dataset.sh" data 3 >paths.txt 2>make.log ||
  { cat make.log; fail "make_brain_dataset.sh"; }
cfg=(--config "$ROOT/launch/configs/quickstart.yaml"
  --data.train=data/brain-train.h5 --data.val=data/brain-val.h5)
mpi -np 2 "$MEMTRAIN" train "${cfg[@]}" --training.epochs=12 \
  --validation.every_epochs=12 --output.dir=run >train.log 2>&1 ||
  { tail -30 train.log; fail "training"; }
grep "val Dice" train.log | tail -1

mkdir -p cases labels
/usr/bin/python3 - "$T" <<'PY'
import sys, numpy as np, nibabel as nib
t = sys.argv[1]
img, lbl = nib.load(f"{t}/ch2.nii.gz"), nib.load(f"{t}/ch2bet.nii.gz")
nib.save(img, "cases/a.nii.gz")
nib.save(lbl, "labels/a.nii.gz")
for src, out in ((img, "cases/b.nii"), (lbl, "labels/b.nii")):
    data = np.asarray(src.dataobj)[10:171, 10:207, 5:176][::-1]
    aff = src.affine.copy()
    aff[:3, 3] = aff[:3, :3] @ np.array([10 + 160, 10, 5]) + aff[:3, 3]
    aff[:3, 0] = -aff[:3, 0]
    im = nib.Nifti1Image(data, aff, src.header)
    im.set_qform(aff, 1)
    im.set_sform(aff, 1)
    nib.save(im, out)
PY
mpi -np 2 "$MEMTRAIN" predict "${cfg[@]}" --weights run/model.safetensors \
  --input cases --labels labels --label-map '>0:1' --out pred >predict.log 2>&1 ||
  { cat predict.log; fail "predict"; }
cat predict.log
grep -q "\[rank 1\]" predict.log || fail "predict: rank 1 predicted no case"

/usr/bin/python3 - <<'PY' || fail "outputs"
import csv, numpy as np, nibabel as nib
from scipy import ndimage
rows = {r["case"]: r for r in csv.DictReader(open("pred/metrics.csv"))}
assert sorted(rows) == ["a", "b"], rows
for case, ext in (("a", ".nii.gz"), ("b", ".nii")):
    src, out = nib.load(f"cases/{case}{ext}"), nib.load(f"pred/{case}.nii.gz")
    assert out.shape == src.shape, (case, out.shape, src.shape)
    assert np.allclose(out.affine, src.affine, atol=1e-4), (case, out.affine, src.affine)
    assert out.get_data_dtype() == np.uint8
    p = np.asarray(out.dataobj) == 1
    assert set(np.unique(np.asarray(out.dataobj))) <= {0, 1}
    t = np.asarray(nib.load(f"labels/{case}{ext}").dataobj) > 0
    dice = 2 * (p & t).sum() / (p.sum() + t.sum())
    sp = src.header.get_zooms()[:3]
    edge = lambda m: m ^ ndimage.binary_erosion(m, border_value=0)
    ep, et = edge(p), edge(t)
    hd = max(np.percentile(ndimage.distance_transform_edt(~et, sampling=sp)[ep], 95),
             np.percentile(ndimage.distance_transform_edt(~ep, sampling=sp)[et], 95))
    r = rows[case]
    print(f"{case}: {src.shape}, Dice {dice:.6f} (csv {r['dice']}), HD95 {hd:.4f} mm (csv {r['hd95_mm']})")
    assert abs(dice - float(r["dice"])) < 1e-5, (dice, r)
    assert abs(hd - float(r["hd95_mm"])) < 1e-3, (hd, r)
    assert int(r["pred_voxels"]) == p.sum() and int(r["true_voxels"]) == t.sum()
    assert dice >= 0.8, (case, dice)
PY

# Bad input: named, exit 2, outputs untouched.
cp pred/a.nii.gz kept.nii.gz
echo "not nifti" >cases/c.nii.gz
set +e
mpi -np 1 "$MEMTRAIN" predict "${cfg[@]}" --weights run/model.safetensors \
  --input cases/c.nii.gz --out pred >bad1.log 2>&1
rc1=$?
mpi -np 1 "$MEMTRAIN" predict "${cfg[@]}" --weights run/missing.safetensors \
  --input cases/a.nii.gz --out pred >bad2.log 2>&1
rc2=$?
set -e
[ $rc1 = 2 ] && grep -q "c.nii.gz" bad1.log || { cat bad1.log; fail "non-NIfTI input: rc $rc1"; }
[ $rc2 = 2 ] && grep -q "missing.safetensors" bad2.log || { cat bad2.log; fail "missing weights: rc $rc2"; }
grep -m1 "error" bad1.log
grep -m1 "error" bad2.log
# A case without the NIfTI magic (issue 35) among valid ones: every input
# header is checked before any output is written; with
# --analyze-orientation it is predicted and its label map carries that
# orientation as its sform.
mkdir -p an
cp cases/a.nii.gz an/a.nii.gz
/usr/bin/python3 - <<'PY'
import numpy as np, nibabel as nib
src = nib.load("cases/a.nii.gz")
im = nib.Nifti1Image(np.asarray(src.dataobj)[::2, ::2, ::2], np.diag([2, 2, 2, 1.0]))
nib.save(im, "an/z.nii")
raw = bytearray(open("an/z.nii", "rb").read())
raw[344:348] = b"\0\0\0\0"
open("an/z.nii", "wb").write(raw)
PY
set +e
mpi -np 1 "$MEMTRAIN" predict "${cfg[@]}" --weights run/model.safetensors \
  --input an --out pred-an >bad3.log 2>&1
rc3=$?
set -e
[ $rc3 = 2 ] && grep -qF "predict: --input 'an/z.nii': no NIfTI magic" bad3.log ||
  { cat bad3.log; fail "magic-less input: rc $rc3"; }
[ -z "$(ls pred-an 2>/dev/null | grep nii)" ] || { ls pred-an; fail "a refused run wrote an output"; }
mpi -np 1 "$MEMTRAIN" predict "${cfg[@]}" --weights run/model.safetensors \
  --input an --out pred-an --analyze-orientation RAS >an.log 2>&1 ||
  { cat an.log; fail "predict --analyze-orientation RAS"; }
/usr/bin/python3 - <<'PY' || fail "the Analyze case's label map"
import numpy as np, nibabel as nib
out = nib.load("pred-an/z.nii.gz")
assert out.shape == (91, 109, 91), out.shape
assert int(out.header["sform_code"]) == 2, out.header["sform_code"]
want = np.diag([2.0, 2, 2, 1])
want[:3, 3] = -np.array([2 * 45, 2 * 54, 2 * 45])
assert np.allclose(out.affine, want), out.affine
print("magic-less case: refused, then predicted with --analyze-orientation RAS, sform", want[:3, 3])
PY
cmp -s kept.nii.gz pred/a.nii.gz || fail "an existing output was changed by a failed run"
ls pred | grep -q tmp && fail "a temporary file was left in pred/"
echo "PASS"
