#!/usr/bin/env bash
# memtrain convert-dataset on small Decathlon / nnU-Net folders built here
# from Debian's Colin27 template (mricron-data: ch2.nii.gz, brain mask =
# ch2bet.nii.gz > 0), subsampled to 4-6 mm so that the files are small.
# Checked with nibabel and h5py, independent readers:
# 1. An nnU-Net v2 folder (dataset.json labels {"background": 0, ...},
#    channel_names, file_ending; imagesTr/CASE_0000.nii.gz, labelsTr/) of
#    5 cases of different crops, spacings and storage: a (RAS), b (a's
#    voxels stored x-flipped), c (a stored LPS), d (another crop at
#    4 x 5 x 6 mm stored with permuted axes, NIfTI-2), e (6 mm, qform
#    only): /volume_shapes are nibabel's as_closest_canonical shapes
#    resampled to the median spacing (computed here); b and c are stored
#    exactly as a (the same world, the same RAS array); a's voxels are
#    its canonical array z-scored over its non-zero voxels; /case_affine
#    and /case_source_affine are nibabel's canonical and file affines;
#    chunks exist only inside each case's extent (h5py's chunk count is
#    the sum of the cases' own chunk grids, below the full grid's);
#    attributes (class_names, num_classes, orientation, spacing_mm,
#    seed, val_fraction, split) and the seeded split (recomputed here);
#    the imagesTs line. The same folder re-saved as NIfTI-2 by nibabel
#    gives the same files. --splits/--fold takes an nnU-Net fold.
# 2. A 2-channel nnU-Net folder (_0000, _0001) and the same cases as an
#    MSD folder (labels {"0": "background"}, modality, training list,
#    one 4D file a case) give the same files; each channel is z-scored
#    on its own.
# 3. Refusals, exit 2, one error line naming the case and file, no output:
#    shape mismatch, affine mismatch, a label outside dataset.json's
#    labels, a missing channel, a missing label file, a NaN voxel, an
#    empty split, an unknown case in splits_final.json, --fold out of range,
#    a case without the NIfTI magic (accepted with --analyze-orientation:
#    the orientation given decides), a directory as a case file, one stem
#    with both endings (in imagesTr/ and in imagesTs/), a zero --spacing, a
#    --spacing whose grid exceeds the memory.
# 4. A 2-rank unet3d run trains and validates on the converted files, and
#    memtrain predict segments imagesTs (one case LPS, one with permuted
#    axes): each label map has its input's exact shape and affine.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
T=/usr/share/mricron/templates
[ -f $T/ch2.nii.gz ] || fail "mricron-data is not installed"
/usr/bin/python3 -c 'import nibabel, scipy, h5py' 2>/dev/null ||
  fail "python3-nibabel, python3-scipy and python3-h5py are needed (bash launch/install_deps.sh)"

/usr/bin/python3 - "$T" <<'PY' || fail "building the folders"
import json, os, sys
import numpy as np, nibabel as nib
t = sys.argv[1]
img0, lbl0 = nib.load(f"{t}/ch2.nii.gz"), nib.load(f"{t}/ch2bet.nii.gz")
I0 = np.asarray(img0.dataobj).astype(np.float32)
L0 = (np.asarray(lbl0.dataobj) > 0).astype(np.uint8)
A0 = img0.affine

def sample(step, start, size):
    """ch2 subsampled by `step` voxels, cropped: data and affine (RAS)."""
    sl = tuple(slice(s * st, (s + n) * st, st) for s, n, st in zip(start, size, step))
    aff = A0.copy()
    aff[:3, 3] = A0[:3, :3] @ np.array([s * st for s, st in zip(start, step)]) + A0[:3, 3]
    aff[:3, :3] = A0[:3, :3] @ np.diag(step)
    return I0[sl], L0[sl], aff

def store(data, aff, flips=(), perm=(0, 1, 2)):
    """The same world data stored with axes flipped, then permuted."""
    aff = aff.copy()
    for a in flips:
        aff[:3, 3] += aff[:3, a] * (data.shape[a] - 1)
        aff[:3, a] = -aff[:3, a]
        data = np.flip(data, a)
    data = np.ascontiguousarray(np.transpose(data, perm))
    return data, aff[:, list(perm) + [3]]

def save(data, aff, path, two=False, qform_only=False):
    im = (nib.Nifti2Image if two else nib.Nifti1Image)(data, aff)
    im.set_qform(aff, 1)
    im.set_sform(None if qform_only else aff, 0 if qform_only else 1)
    nib.save(im, path)

cases = {  # name: (step, start, size, flips, perm, NIfTI-2, qform only)
    "a": ((5, 5, 5), (2, 3, 1), (30, 36, 30), (), (0, 1, 2), False, False),
    "b": ((5, 5, 5), (2, 3, 1), (30, 36, 30), (0,), (0, 1, 2), False, False),
    "c": ((5, 5, 5), (2, 3, 1), (30, 36, 30), (0, 1), (0, 1, 2), False, False),
    "d": ((4, 5, 6), (6, 6, 5), (30, 28, 20), (), (2, 0, 1), True, False),
    "e": ((6, 6, 6), (5, 5, 4), (20, 24, 18), (), (0, 1, 2), False, True),
}
test = {  # imagesTs: LPS, and y flipped + permuted
    "t1": ((5, 5, 5), (1, 1, 1), (33, 40, 33), (0, 1), (0, 1, 2), False, False),
    "t2": ((5, 5, 5), (3, 2, 2), (28, 38, 31), (1,), (1, 2, 0), False, False),
}
for d in ("nn/imagesTr", "nn/labelsTr", "nn/imagesTs", "nn2/imagesTr",
          "nn2/labelsTr", "msd/imagesTr", "msd/labelsTr"):
    os.makedirs(d, exist_ok=True)
for name, (step, start, size, flips, perm, two, qo) in cases.items():
    i, l, aff = sample(step, start, size)
    si, sa = store(i, aff, flips, perm)
    sl, _ = store(l, aff, flips, perm)
    save(si, sa, f"nn/imagesTr/case_{name}_0000.nii.gz", two, qo)
    save(sl, sa, f"nn/labelsTr/case_{name}.nii.gz", two, qo)
    # 2 channels: the image and 255 - image inside the head.
    i2 = np.where(si > 0, 255 - si, 0).astype(np.float32)
    save(si, sa, f"nn2/imagesTr/case_{name}_0000.nii.gz", two, qo)
    save(i2, sa, f"nn2/imagesTr/case_{name}_0001.nii.gz", two, qo)
    save(sl, sa, f"nn2/labelsTr/case_{name}.nii.gz", two, qo)
    save(np.stack([si, i2], axis=3), sa, f"msd/imagesTr/case_{name}.nii.gz", two, qo)
    save(sl, sa, f"msd/labelsTr/case_{name}.nii.gz", two, qo)
for name, (step, start, size, flips, perm, two, qo) in test.items():
    i, _, aff = sample(step, start, size)
    si, sa = store(i, aff, flips, perm)
    save(si, sa, f"nn/imagesTs/{name}_0000.nii.gz")
json.dump({"channel_names": {"0": "T1"}, "labels": {"background": 0, "brain": 1},
           "numTraining": 5, "file_ending": ".nii.gz"}, open("nn/dataset.json", "w"))
json.dump({"channel_names": {"0": "T1", "1": "inverted"},
           "labels": {"background": 0, "brain": 1}, "numTraining": 5,
           "file_ending": ".nii.gz"}, open("nn2/dataset.json", "w"))
json.dump({"name": "brain", "modality": {"0": "T1", "1": "inverted"},
           "labels": {"0": "background", "1": "brain"}, "numTraining": 5,
           "training": [{"image": f"./imagesTr/case_{n}.nii.gz",
                         "label": f"./labelsTr/case_{n}.nii.gz"} for n in cases],
           "test": []}, open("msd/dataset.json", "w"))
json.dump([{"train": ["case_a", "case_b", "case_d"], "val": ["case_c", "case_e"]},
           {"train": ["case_c", "case_e", "case_d"], "val": ["case_a", "case_b"]}],
          open("splits_final.json", "w"))
PY
ls nn/imagesTr nn/labelsTr nn/imagesTs | tr '\n' ' '
echo

# 1. The nnU-Net folder.
start=$SECONDS
"$MEMTRAIN" convert-dataset --folder nn --out out/nn --val-fraction 0.4 --seed 7 \
  --chunk 8 >nn.log 2>&1 || { cat nn.log; fail "convert-dataset nn"; }
echo "convert-dataset nn: $((SECONDS - start)) s"
cat nn.log
grep -q "^wrote out/nn-train.h5 (train): 3 cases" nn.log || fail "train line"
grep -q "^wrote out/nn-val.h5 (val): 2 cases" nn.log || fail "val line"
grep -qF "nn/imagesTs: 2 test case(s), not converted" nn.log || fail "imagesTs line"
grep -qF "memtrain predict --config CONFIG --weights WEIGHTS --input nn/imagesTs" nn.log ||
  fail "imagesTs: no predict command"

/usr/bin/python3 - <<'PY' || fail "nn files"
import numpy as np, nibabel as nib, h5py

def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)
def fnv(s):
    h = 14695981039346656037
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) % 2**64
    return h
def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return x ^ (x >> 31)
names = sorted(f"case_{n}" for n in "abcde")
keys = sorted((splitmix(fnv(n) ^ splitmix(7)), n) for n in names)
nval = int(np.floor(0.4 * len(names) + 0.5))
want_val = sorted(n for _, n in keys[:nval])
want_train = sorted(n for _, n in keys[nval:])

canon, src = {}, {}
for n in names:
    src[n] = nib.load(f"nn/imagesTr/{n}_0000.nii.gz")
    canon[n] = nib.as_closest_canonical(src[n])
sp = {n: np.linalg.norm(c.affine[:3, :3], axis=0)[::-1] for n, c in canon.items()}  # D,H,W
target = np.median(np.array([sp[n] for n in names]), axis=0)
def out_shape(n):
    dhw = np.array(canon[n].shape[::-1])
    return np.maximum(1, np.floor(dhw * sp[n] / target + 0.5)).astype(int)
print("target spacing (D,H,W)", target)

rows = {}
for path, split, want in (("out/nn-train.h5", "train", want_train),
                          ("out/nn-val.h5", "val", want_val)):
    f = h5py.File(path, "r")
    got = [s.decode() for s in f["case_names"][:]]
    assert got == want, (path, got, want)
    a = f.attrs
    assert text(a["orientation"]) == "RAS", a["orientation"]
    assert text(a["class_names"]) == "background,brain", a["class_names"]
    assert text(a["kind"]) == "volumes" and text(a["split"]) == split
    assert int(a["num_classes"]) == 2 and int(a["layout_version"]) == 1
    assert np.allclose(a["spacing_mm"], target), (a["spacing_mm"], target)
    assert int(a["seed"]) == 7 and abs(a["val_fraction"] - 0.4) < 1e-12
    vol, msk = f["volumes"], f["masks"]
    assert vol.dtype == np.float32 and msk.dtype == np.uint8
    assert vol.compression == "gzip" and vol.fletcher32 and msk.fletcher32
    assert vol.attrs["scale"] == 1 and vol.attrs["shift"] == 0
    shapes = f["volume_shapes"][:]
    n = len(got)
    assert vol.shape[:2] == (n, 1) and tuple(vol.shape[2:]) == tuple(shapes.max(0)), (vol.shape, shapes)
    assert vol.chunks == (1, 1, 8, 8, 8) and msk.chunks == (1, 8, 8, 8)
    own = 0
    for i, name in enumerate(got):
        assert tuple(shapes[i]) == tuple(out_shape(name)), (name, shapes[i], out_shape(name))
        own += int(np.prod(np.ceil(shapes[i] / 8)))
        assert tuple(f["case_source_shape"][i]) == src[name].shape[:3]
        assert np.allclose(f["case_source_affine"][i], src[name].affine, atol=1e-4), name
        d, h, w = shapes[i]
        rows[name] = (vol[i, :, :d, :h, :w], msk[i, :d, :h, :w], f["case_affine"][i])
    full = n * int(np.prod(np.ceil(np.array(vol.shape[2:]) / 8)))
    for ds in (vol, msk):
        nch = ds.id.get_num_chunks()
        print(f"{path} {ds.name}: {nch} chunks stored, the cases' own {own}, full grid {full}")
        assert nch == own < full, (ds.name, nch, own, full)
        for c in range(nch):
            off = ds.id.get_chunk_info(c).chunk_offset
            assert all(o < s for o, s in zip(off[-3:], shapes[off[0]])), (ds.name, off)
    print(f"{path}: {got}, shapes {shapes.tolist()}, /volumes {vol.shape}")

# b and c are a stored otherwise: the same RAS arrays.
for other in ("case_b", "case_c"):
    for k in range(2):
        assert np.array_equal(rows["case_a"][k], rows[other][k]), (other, k)
    assert np.allclose(rows["case_a"][2], rows[other][2], atol=1e-4)
# a is at the target spacing: its canonical array, z-scored; its labels.
ca = canon["case_a"]
x = np.asarray(ca.dataobj).astype(np.float64).transpose(2, 1, 0)
nz = x[x != 0]
z = (x - nz.mean()) / nz.std()
assert np.allclose(rows["case_a"][0][0], z, atol=1e-4), np.abs(rows["case_a"][0][0] - z).max()
assert np.allclose(rows["case_a"][2], ca.affine, atol=1e-4), (rows["case_a"][2], ca.affine)
lab = np.asarray(nib.as_closest_canonical(nib.load("nn/labelsTr/case_a.nii.gz")).dataobj)
assert np.array_equal(rows["case_a"][1], lab.transpose(2, 1, 0))
# Every case: the stored grid's affine has the target spacing, centred on
# the source grid.
for name in names:
    aff, c0 = rows[name][2], canon[name]
    n_in, m = np.array(c0.shape[:3]), np.array(rows[name][1].shape[::-1])
    centre_in = c0.affine @ np.append((n_in - 1) / 2, 1)
    centre_out = aff @ np.append((m - 1) / 2, 1)
    assert np.allclose(centre_in, centre_out, atol=1e-3), (name, centre_in, centre_out)
    assert np.allclose(np.linalg.norm(aff[:3, :3], axis=0), target[::-1], atol=1e-4)
    print(f"{name}: RAS {c0.shape} at {sp[name][::-1]} mm -> {tuple(m)}")
PY

# NIfTI-2: the folder with every file re-saved by nibabel as Nifti2Image
# (same voxels, affines and codes) converts to the same files.
/usr/bin/python3 - <<'PY' || fail "NIfTI-2 twin folder"
import glob, os, shutil
import numpy as np, nibabel as nib
shutil.copytree("nn", "nn-n2")
for p in glob.glob("nn-n2/*/*.nii.gz"):
    one = nib.load(p)
    two = nib.Nifti2Image(np.asarray(one.dataobj), one.affine)
    two.set_qform(*one.get_qform(coded=True))
    two.set_sform(*one.get_sform(coded=True))
    nib.save(two, p)
    assert nib.load(p).header.sizeof_hdr == 540
PY
"$MEMTRAIN" convert-dataset --folder nn-n2 --out out/nn-n2 --val-fraction 0.4 --seed 7 \
  --chunk 8 >nn-n2.log 2>&1 || { cat nn-n2.log; fail "convert-dataset nn-n2"; }
/usr/bin/python3 - <<'PY' || fail "NIfTI-2 twin files"
import h5py, numpy as np
for s in ("train", "val"):
    a, b = h5py.File(f"out/nn-{s}.h5", "r"), h5py.File(f"out/nn-n2-{s}.h5", "r")
    for ds in a:
        assert np.array_equal(a[ds][:], b[ds][:]), (s, ds)
print("every file re-saved as NIfTI-2: the same files")
PY

"$MEMTRAIN" convert-dataset --folder nn --out out/fold --splits splits_final.json \
  --fold 1 --spacing 5,5,5 >fold.log 2>&1 || { cat fold.log; fail "--fold 1"; }
/usr/bin/python3 - <<'PY' || fail "fold files"
import h5py, numpy as np
t, v = h5py.File("out/fold-train.h5", "r"), h5py.File("out/fold-val.h5", "r")
names = lambda f: [s.decode() for s in f["case_names"][:]]
assert names(t) == ["case_c", "case_d", "case_e"] and names(v) == ["case_a", "case_b"], (names(t), names(v))
assert int(t.attrs["fold"]) == 1 and "val_fraction" not in t.attrs
assert np.allclose(t.attrs["spacing_mm"], [5, 5, 5])
print("fold 1:", names(t), names(v))
PY

# 2. Two channels: nnU-Net files and MSD 4D files give the same files.
"$MEMTRAIN" convert-dataset --folder nn2 --out out/nn2 --val-fraction 0.4 --seed 7 \
  --chunk 8 >nn2.log 2>&1 || { cat nn2.log; fail "convert-dataset nn2"; }
"$MEMTRAIN" convert-dataset --folder msd --out out/msd --val-fraction 0.4 --seed 7 \
  --chunk 8 >msd.log 2>&1 || { cat msd.log; fail "convert-dataset msd"; }
cat nn2.log msd.log
grep -q "imagesTs" msd.log && fail "msd has no imagesTs but a line says so"
/usr/bin/python3 - <<'PY' || fail "2-channel files"
import h5py, numpy as np, nibabel as nib
def zscore(path):
    x = np.asarray(nib.as_closest_canonical(nib.load(path)).dataobj).astype(np.float64).transpose(2, 1, 0)
    nz = x[x != 0]
    return (x - nz.mean()) / nz.std()
for s in ("train", "val"):
    a, b = h5py.File(f"out/nn2-{s}.h5", "r"), h5py.File(f"out/msd-{s}.h5", "r")
    assert a["volumes"].shape[1] == 2, a["volumes"].shape
    for ds in ("volumes", "masks", "volume_shapes", "case_names", "case_affine"):
        assert np.array_equal(a[ds][:], b[ds][:]), (s, ds)
    one = h5py.File(f"out/nn-{s}.h5", "r")
    names = [n.decode() for n in a["case_names"][:]]
    for i, (d, h, w) in enumerate(a["volume_shapes"][:]):
        v = a["volumes"][i, :, :d, :h, :w]
        assert np.allclose(v[0], one["volumes"][i, 0, :d, :h, :w], atol=1e-5), names[i]
        if names[i] == "case_a":  # at the target spacing: each channel z-scored alone
            for c in range(2):
                z = zscore(f"nn2/imagesTr/case_a_000{c}.nii.gz")
                assert np.allclose(v[c], z, atol=1e-4), (c, np.abs(v[c] - z).max())
            print("case_a: both channels z-scored on their own")
print("nn2 == msd; channel 0 == the 1-channel file")
PY

# 3. Refusals: exit 2, one error line naming case and file, no output.
mkdir -p bad
refuse() {  # NAME PATTERN FOLDER [ARGS...]
  local name=$1 pattern=$2 folder=$3 rc=0
  shift 3
  "$MEMTRAIN" convert-dataset --folder "$folder" --out "bad/$name" "$@" \
    >"bad-$name.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "bad-$name.log"; fail "$name: exit $rc, want 2"; }
  [ "$(grep -c 'memtrain: error:' "bad-$name.log")" = 1 ] || { cat "bad-$name.log"; fail "$name: error lines"; }
  grep -qF -- "$pattern" "bad-$name.log" || { cat "bad-$name.log"; fail "$name: no '$pattern'"; }
  [ -z "$(ls bad)" ] || { ls bad; fail "$name: output left behind"; }
  echo "ok $name: $(grep 'memtrain: error:' "bad-$name.log")"
}
variant() {  # NAME: a copy of nn to break
  rm -rf "v-$1" && cp -r nn "v-$1"
}
variant shape
/usr/bin/python3 - <<'PY'
import nibabel as nib, numpy as np
p = "v-shape/labelsTr/case_d.nii.gz"
l = nib.load(p)
nib.save(nib.Nifti2Image(np.asarray(l.dataobj)[:-1], l.affine), p)
PY
refuse shape "grid mismatch: case case_d image 'v-shape/imagesTr/case_d_0000.nii.gz'" v-shape
variant affine
/usr/bin/python3 - <<'PY'
import nibabel as nib, numpy as np
p = "v-affine/labelsTr/case_b.nii.gz"
l = nib.load(p)
aff = l.affine.copy()
aff[0, 3] += 2
nib.save(nib.Nifti1Image(np.asarray(l.dataobj), aff), p)
PY
refuse affine "case case_b label 'v-affine/labelsTr/case_b.nii.gz' have the same grid" v-affine
variant label
/usr/bin/python3 - <<'PY'
import nibabel as nib, numpy as np
p = "v-label/labelsTr/case_e.nii.gz"
l = nib.load(p)
d = np.asarray(l.dataobj).copy()
d[3, 4, 5] = 2
im = nib.Nifti1Image(d, l.affine)
im.set_sform(None, 0)
im.set_qform(l.affine, 1)
nib.save(im, p)
PY
refuse label "case case_e label 'v-label/labelsTr/case_e.nii.gz': voxel (3,4,5) has label 2, not in dataset.json's labels (0..1)" v-label
rm -rf v-chan && cp -r nn2 v-chan && rm v-chan/imagesTr/case_c_0001.nii.gz
refuse channel "case case_c: missing channel 1 (inverted) file 'v-chan/imagesTr/case_c_0001.nii.gz'" v-chan
variant nolabel
rm v-nolabel/labelsTr/case_a.nii.gz
refuse nolabel "case case_a: no label file 'v-nolabel/labelsTr/case_a.nii.gz'" v-nolabel
variant nan
/usr/bin/python3 - <<'PY'
import nibabel as nib, numpy as np
p = "v-nan/imagesTr/case_a_0000.nii.gz"
l = nib.load(p)
d = np.asarray(l.dataobj).copy()
d[1, 2, 3] = np.nan
nib.save(nib.Nifti1Image(d, l.affine), p)
PY
refuse nan "case case_a image 'v-nan/imagesTr/case_a_0000.nii.gz': voxel (1,2,3) is nan" v-nan
refuse empty "--val-fraction 0.05 of 5 cases gives 5 training and 0 validation cases" nn --val-fraction 0.05
echo '[{"train": ["case_a", "case_x"], "val": ["case_b"]}]' >bad-splits.json
refuse unknown "fold 0 lists case 'case_x', which is not a training case of 'nn'" nn \
  --splits bad-splits.json --fold 0
refuse fold "--fold 2 is out of range: --splits 'splits_final.json' has 2 fold(s)" nn \
  --splits splits_final.json --fold 2
# Issue 35: a case whose files lack the NIfTI magic (Analyze 7.5 headers)
# is refused, not read mirrored; --analyze-orientation accepts it with the
# orientation given: case_b (stored LAS) then converts to the same RAS
# voxels as before, and RAS instead mirrors it (the user's word, but the
# option is what changes it).
variant nomagic
/usr/bin/python3 - <<'PY'
import gzip
for p in ("v-nomagic/imagesTr/case_b_0000.nii.gz", "v-nomagic/labelsTr/case_b.nii.gz"):
    raw = bytearray(gzip.decompress(open(p, "rb").read()))
    raw[344:348] = b"\0\0\0\0"
    open(p, "wb").write(gzip.compress(bytes(raw)))
PY
refuse nomagic "case case_b label 'v-nomagic/labelsTr/case_b.nii.gz': no NIfTI magic" v-nomagic
refuse analyze-unused "--analyze-orientation LAS is given but no case file is an Analyze 7.5 file" \
  nn --analyze-orientation LAS
refuse analyze-code "--analyze-orientation 'RAR' is not an axis code" \
  v-nomagic --analyze-orientation RAR
for o in LAS RAS; do
  "$MEMTRAIN" convert-dataset --folder v-nomagic --out "out/an-$o" --val-fraction 0.4 \
    --seed 7 --chunk 8 --analyze-orientation $o >"an-$o.log" 2>&1 ||
    { cat "an-$o.log"; fail "convert-dataset --analyze-orientation $o"; }
done
/usr/bin/python3 - <<'PY' || fail "Analyze case with --analyze-orientation"
import h5py, numpy as np
def case(prefix, name):
    for split in ("train", "val"):
        f = h5py.File(f"{prefix}-{split}.h5")
        names = [n.decode() for n in f["case_names"][()]]
        if name in names:
            i = names.index(name)
            d, h, w = f["volume_shapes"][i]
            return f["volumes"][i, 0, :d, :h, :w], f["masks"][i, :d, :h, :w]
want = case("out/nn", "case_b")
las, ras = case("out/an-LAS", "case_b"), case("out/an-RAS", "case_b")
assert np.allclose(las[0], want[0], atol=1e-5) and np.array_equal(las[1], want[1])
assert np.array_equal(ras[1], want[1][:, :, ::-1]) and not np.array_equal(ras[1], want[1])
print("Analyze case_b: LAS gives the NIfTI conversion's voxels, RAS mirrors them")
PY
variant dirlabel
rm v-dirlabel/labelsTr/case_a.nii.gz && mkdir v-dirlabel/labelsTr/case_a.nii.gz
refuse dirlabel "case case_a: label 'v-dirlabel/labelsTr/case_a.nii.gz' is a directory, not a file" v-dirlabel
variant dirimage
mkdir v-dirimage/imagesTr/case_f_0000.nii.gz
refuse dirimage "'v-dirimage/imagesTr/case_f_0000.nii.gz' is a directory, not a file" v-dirimage
# One stem with both endings: refused before anything is written, in
# imagesTr/ and in imagesTs/ (counted, not converted, listed first).
variant twin-tr
cp v-twin-tr/imagesTr/case_a_0000.nii.gz v-twin-tr/imagesTr/case_a_0000.nii
refuse twin-tr "'v-twin-tr/imagesTr/case_a_0000.nii' and 'v-twin-tr/imagesTr/case_a_0000.nii.gz' are both case case_a's channel 0 file; keep one" v-twin-tr
variant twin-ts
cp v-twin-ts/imagesTs/t1_0000.nii.gz v-twin-ts/imagesTs/t1_0000.nii
refuse twin-ts "are both case t1's channel 0 file; keep one" v-twin-ts
refuse spacing0 "--spacing '0,1,1' is not D,H,W" nn --spacing 0,1,1
refuse spacing-memory "--spacing 1e-4,1e-4,1e-4 (case case_a) makes a" nn --spacing 1e-4,1e-4,1e-4

# 4. Train on the ragged files (2 ranks), then predict imagesTs.
cat >unet.yaml <<'YAML'
model: {name: unet3d, feature_size: 4, depth: 2, norm: instance, seed: 1}
data:
  train: out/nn-train.h5
  val: out/nn-val.h5
  patch_size: [16, 16, 16]
  patches_per_volume: 4
  pos_fraction: 0.5
  batch_size: 2
  read_threads: 1
  seed: 3
validation: {every_epochs: 2, roi: [16, 16, 16], overlap: 0.25, sw_batch: 2}
training: {epochs: 2, effective_batch_size: 4, optimizer: adamw, lr: 0.003}
output: {dir: run}
YAML
start=$SECONDS
mpi -np 2 "$MEMTRAIN" train --config unet.yaml >train.log 2>&1 ||
  { tail -30 train.log; fail "training on the converted files"; }
echo "train: 2 ranks, $((SECONDS - start)) s"
grep -q '"validation"' run/metrics.jsonl || fail "no validation record in run/metrics.jsonl"
start=$SECONDS
# As in the Decathlon's archives: a macOS "._" file beside a case, skipped.
echo "not a NIfTI file" >nn/imagesTs/._t1_0000.nii.gz
mpi -np 2 "$MEMTRAIN" predict --config unet.yaml --weights run/model.safetensors \
  --input nn/imagesTs --out pred >predict.log 2>&1 || { cat predict.log; fail "predict"; }
echo "predict: 2 ranks, $((SECONDS - start)) s"
cat predict.log
grep -q "reoriented to RAS" predict.log || fail "predict did not reorient"
/usr/bin/python3 - <<'PY' || fail "predicted label maps"
import numpy as np, nibabel as nib
for n in ("t1", "t2"):
    src, out = nib.load(f"nn/imagesTs/{n}_0000.nii.gz"), nib.load(f"pred/{n}.nii.gz")
    assert out.shape == src.shape, (n, out.shape, src.shape)
    assert np.allclose(out.affine, src.affine, atol=1e-5), (n, out.affine, src.affine)
    v = np.asarray(out.dataobj)
    assert set(np.unique(v).tolist()) <= {0, 1}, np.unique(v)
    print(f"{n}: {out.shape}, the input's shape and affine, classes {sorted(set(np.unique(v).tolist()))}")
PY

# 5. Two channels: train on the nn2 files, predict nn2/imagesTr, whose
#    cases are two files each (CASE_0000, CASE_0001: one case, written
#    as CASE.nii.gz), with --labels: one Dice row per case and class.
start=$SECONDS
mpi -np 2 "$MEMTRAIN" train --config unet.yaml --data.train=out/nn2-train.h5 \
  --data.val=out/nn2-val.h5 --training.epochs=1 --output.dir=run2 >train2.log 2>&1 ||
  { tail -30 train2.log; fail "training on the 2-channel files"; }
mpi -np 2 "$MEMTRAIN" predict --config unet.yaml --data.train=out/nn2-train.h5 \
  --weights run2/model.safetensors --input nn2/imagesTr --labels nn2/labelsTr \
  --out pred2 >predict2.log 2>&1 || { cat predict2.log; fail "predict, 2 channels"; }
echo "2 channels: train and predict, $((SECONDS - start)) s"
grep -q "predict: 5 case(s)" predict2.log || { cat predict2.log; fail "predict2: not 5 cases"; }
/usr/bin/python3 - <<'PY' || fail "2-channel label maps"
import csv, numpy as np, nibabel as nib
rows = list(csv.DictReader(open("pred2/metrics.csv")))
names = sorted({r["case"] for r in rows})
assert names == [f"case_{n}" for n in "abcde"], names
for n in names:
    src, out = nib.load(f"nn2/imagesTr/{n}_0000.nii.gz"), nib.load(f"pred2/{n}.nii.gz")
    assert out.shape == src.shape, (n, out.shape, src.shape)
    assert np.allclose(out.affine, src.affine, atol=1e-5), (n, out.affine, src.affine)
print(f"2 channels: {len(names)} cases as CASE.nii.gz on their inputs' grids, "
      f"{len(rows)} metric rows")
PY
rm -rf v-pred && mkdir v-pred && cp nn2/imagesTr/case_a_0001.nii.gz v-pred/
mpi -np 1 "$MEMTRAIN" predict --config unet.yaml --data.train=out/nn2-train.h5 \
  --weights run2/model.safetensors --input v-pred --out pred3 >predict3.log 2>&1 &&
  fail "a case without its channel 0 file was predicted"
grep -qF "case 'case_a' has case_a_0001.nii.gz but no channel 0 file before it" predict3.log ||
  { cat predict3.log; fail "predict3: message"; }
echo "PASS"
