#!/usr/bin/env bash
# memtrain convert-nifti on real NIfTI files (Debian's mricron-data): the
# brain-mask and AAL datasets of data/make_*_dataset.sh, other shapes and
# datatypes, and bad inputs (exit status 2, one error line naming the file
# or the flag, no output file touched).
REPO=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/common.sh"
T=/usr/share/mricron/templates
[ -f $T/ch2.nii.gz ] || fail "mricron-data is not installed (apt-get install mricron-data)"

# summary FILE: the convert-nifti line for FILE from log.txt
line_of() { grep -F "wrote $1 " log.txt || fail "no summary line for $1"; }
expect_line() {  # FILE PATTERN
  line_of "$1" | grep -qF -- "$2" || { line_of "$1"; fail "$1: want '$2'"; }
}

# check_h5 FILE C D H W [CHUNK]: an HDF5 file whose size fits [1,C,D,H,W]
# float32 + [1,D,H,W] uint8, uncompressed, in chunks of CHUNK (32) voxels a
# side (edge chunks are stored whole), with the layout's names in it; then
# `memtrain inspect FILE` (after the summary line of FILE is in log.txt).
check_h5() {
  local f=$1 c=$2 d=$3 h=$4 w=$5 k=${6:-32}
  "$PY" - "$f" "$c" "$d" "$h" "$w" "$k" <<'PYEOF' || fail "check_h5 $f"
import sys
f = sys.argv[1]
c, d, h, w, k = map(int, sys.argv[2:])
data = open(f, "rb").read()
assert data[:8] == b"\x89HDF\r\n\x1a\n", f"{f}: not HDF5"
def pad(n):
    e = min(k, n)
    return -(-n // e) * e
stored = (c * 4 + 1) * pad(d) * pad(h) * pad(w)
assert stored <= len(data) < stored + 200_000, (f, stored, len(data))
for name in [b"volumes", b"masks", b"layout_version", b"num_classes",
             b"spacing_mm", b"scale", b"shift", b"source", b"kind"]:
    assert name in data, (f, name)
PYEOF
  # memtrain's own reader agrees: layout, shape, and the voxels per class of
  # the converter's summary line (log.txt).
  "$MEMTRAIN" inspect "$f" >inspect.txt 2>&1 || { cat inspect.txt; fail "inspect $f"; }
  grep -q "problems: none" inspect.txt || { cat inspect.txt; fail "inspect $f"; }
  grep -qF "/volumes  float32 [1, $c, $d, $h, $w]" inspect.txt ||
    { cat inspect.txt; fail "inspect $f: shape [1, $c, $d, $h, $w] not shown"; }
  local want got
  want=$(line_of "$f" | sed 's/.*voxels per class://' | tr -d ' ' | tr ',' ' ')
  got=$(grep "voxels per class:" inspect.txt | sed 's/.*voxels per class://' |
    tr ',' ' ' | xargs)
  # inspect may leave out empty classes: compare the non-zero ones.
  want=$(echo "$want" | tr ' ' '\n' | grep -v '=0$' | xargs)
  got=$(echo "$got" | tr ' ' '\n' | grep -v '=0$' | xargs)
  [ -n "$want" ] && [ "$want" = "$got" ] || { cat inspect.txt; fail "inspect $f: voxels per class '$got', want '$want'"; }
}

# --- the brain-mask dataset, 3 mm --------------------------------------------
MEMTRAIN=$MEMTRAIN bash "$REPO/data/make_brain_dataset.sh" brain 3 >paths.txt 2>log.txt ||
  { cat log.txt; fail "make_brain_dataset.sh"; }
cat log.txt
[ "$(cat paths.txt)" = "$(printf 'brain/brain-train.h5\nbrain/brain-val.h5')" ] ||
  { cat paths.txt; fail "make_brain_dataset.sh printed other paths"; }
# 181x217x181 at 1 mm -> 60x72x60 at 3 mm; x split 0.3: 18 val, 42 train.
expect_line brain/brain-train.h5 "/volumes [1, 1, 60, 72, 42]"
expect_line brain/brain-val.h5 "/volumes [1, 1, 60, 72, 18]"
expect_line brain/brain-train.h5 "spacing 3 x 3 x 3 mm, 2 classes"
"$PY" - <<'PYEOF'
import re
counts = {}
for l in open("log.txt"):
    m = re.match(r"wrote (\S+) .*/volumes \[1, 1, (\d+), (\d+), (\d+)\].*"
                 r"background=(\d+), brain=(\d+)$", l.strip())
    if m:
        d, h, w, bg, br = map(int, m.groups()[1:])
        assert bg + br == d * h * w, l
        assert br > 0.1 * d * h * w and bg > 0, l
        counts[m.group(1)] = br
# ch2bet has 1737193 brain voxels of 1 mm^3: about 64300 of 27 mm^3.
total = sum(counts.values())
assert abs(total - 1737193 / 27) < 0.02 * 1737193 / 27, total
assert 0.10 < counts["brain/brain-val.h5"] / total < 0.25, counts
print("ok: brain voxels", counts)
PYEOF
check_h5 brain/brain-train.h5 1 60 72 42 16  # --chunk 16: patches of [32, 32, 16]
check_h5 brain/brain-val.h5 1 60 72 18 16

# The unsplit volume has the slabs' voxels, no more: no overlap.
"$MEMTRAIN" convert-nifti --image $T/ch2.nii.gz --labels $T/ch2bet.nii.gz \
  --label-map '>0:1' --resample 3 --out all/brain.h5 >log_all.txt
cat log_all.txt
"$PY" - <<'PYEOF'
import re
def brain(path, f):
    for l in open(f):
        if l.startswith(f"wrote {path} "):
            return int(re.search(r"1=(\d+)$", l.strip()).group(1))
    raise SystemExit(f"no line for {path}")
full = brain("all/brain.h5", "log_all.txt")
parts = 0
for l in open("log.txt"):
    m = re.search(r"brain=(\d+)$", l.strip())
    parts += int(m.group(1)) if m else 0
assert full == parts, (full, parts)
print("ok: train + val brain voxels =", full)
PYEOF
grep -qF "wrote all/brain.h5 (all): /volumes [1, 1, 60, 72, 60]" log_all.txt ||
  fail "unsplit shape"

# --- the AAL dataset, 3 mm: 8 classes, each in both halves -------------------
MEMTRAIN=$MEMTRAIN bash "$REPO/data/make_aal_dataset.sh" aal 3 >paths.txt 2>log.txt ||
  { cat log.txt; fail "make_aal_dataset.sh"; }
cat log.txt
expect_line aal/aal-train.h5 "/volumes [1, 1, 60, 72, 30]"
expect_line aal/aal-val.h5 "/volumes [1, 1, 60, 72, 30]"
expect_line aal/aal-val.h5 "8 classes"
for f in aal/aal-train.h5 aal/aal-val.h5; do
  for c in frontal insula_limbic occipital parietal subcortical temporal cerebellum; do
    line_of $f | grep -qE " $c=[1-9]" || { line_of $f; fail "$f: no $c voxels"; }
  done
  check_h5 $f 1 60 72 30
done

# --- other shapes and datatypes -------------------------------------------
# float32 image + int16 labels (values up to 1605), 0.5 mm, split along z.
"$MEMTRAIN" convert-nifti --image $T/inia19-t1-brain.nii.gz \
  --labels $T/inia19-NeuroMaps.nii.gz --label-map '>0:1' \
  --split-axis z --val-fraction 0.25 --out inia/inia.h5 >log.txt ||
  fail "inia19 convert"
cat log.txt
expect_line inia/inia-train.h5 "/volumes [1, 1, 96, 206, 168]"
expect_line inia/inia-val.h5 "/volumes [1, 1, 32, 206, 168]"
expect_line inia/inia-val.h5 "spacing 0.5 x 0.5 x 0.5 mm"
check_h5 inia/inia-train.h5 1 96 206 168
check_h5 inia/inia-val.h5 1 32 206 168
# uint8 labels used as they are: Brodmann areas 0..48 -> 49 classes; 2 mm.
"$MEMTRAIN" convert-nifti --image $T/ch2.nii.gz --labels $T/brodmann.nii.gz \
  --resample 2 --chunk 16 --out brodmann.h5 >log.txt || fail "brodmann convert"
cat log.txt
expect_line brodmann.h5 "/volumes [1, 1, 91, 109, 91]"
expect_line brodmann.h5 "49 classes"
check_h5 brodmann.h5 1 91 109 91 16
# A 2 mm grid at its own resolution: JHU white-matter labels as both.
"$MEMTRAIN" convert-nifti --image $T/JHU-WhiteMatter-labels-2mm.nii.gz \
  --labels $T/JHU-WhiteMatter-labels-2mm.nii.gz --label-map '1-48:1' \
  --out jhu.h5 >log.txt || fail "jhu convert"
cat log.txt
expect_line jhu.h5 "/volumes [1, 1, 91, 109, 91]"
expect_line jhu.h5 "spacing 2 x 2 x 2 mm, 2 classes"
check_h5 jhu.h5 1 91 109 91
# ch2 and ch2better are the same head on other grids: after --resample 2 the
# grids agree, but the converter requires the same input grid.

# --- bad inputs: exit 2, one error line naming the file or flag ---------------
echo "this is not NIfTI" >text.nii
cp brain/brain-train.h5 keep.h5
expect_error() {  # PATTERN ARGS...
  local pattern=$1 rc=0
  shift
  "$MEMTRAIN" convert-nifti "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" = 2 ] || { cat out.txt err.txt; fail "$*: exit $rc, want 2"; }
  [ "$(grep -c 'memtrain: error:' err.txt)" = 1 ] || { cat err.txt; fail "$*: error lines"; }
  grep -qF -- "$pattern" err.txt || { cat err.txt; fail "$*: no '$pattern'"; }
  echo "ok: $(cat err.txt)"
}
B=(--labels "$T/ch2bet.nii.gz" --out brain/brain.h5)
expect_error "--image 'missing.nii.gz': no such file" --image missing.nii.gz "${B[@]}"
expect_error "--image 'text.nii': not a NIfTI file" --image text.nii "${B[@]}"
expect_error "grid mismatch: --image '$T/ch2.nii.gz' is 181x217x181 but --labels '$T/JHU-WhiteMatter-labels-2mm.nii.gz' is 91x109x91" \
  --image $T/ch2.nii.gz --labels $T/JHU-WhiteMatter-labels-2mm.nii.gz --out x.h5
expect_error "grid mismatch: --image '$T/ch2better.nii.gz' is 301x370x316" \
  --image $T/ch2better.nii.gz "${B[@]}" --resample 2
expect_error "different voxel-to-world transforms" \
  --image $T/AICHAmc.nii.gz --labels $T/JHU-WhiteMatter-labels-2mm.nii.gz --out x.h5
expect_error "--labels '$T/inia19-NeuroMaps.nii.gz': voxel" \
  --image $T/inia19-t1-brain.nii.gz --labels $T/inia19-NeuroMaps.nii.gz --out x.h5
expect_error "--label-map '>0:1,7': rule '7' has no ':CLASS'" \
  --image $T/ch2.nii.gz "${B[@]}" --label-map '>0:1,7'
expect_error "--split-axis 'w' is not x, y or z" --image $T/ch2.nii.gz "${B[@]}" --split-axis w
expect_error "--val-fraction 1.5 is not in (0, 1)" \
  --image $T/ch2.nii.gz "${B[@]}" --split-axis x --val-fraction 1.5
expect_error "--val-fraction 0.001 along --split-axis y (217 planes) gives 217 training and 0 validation planes" \
  --image $T/ch2.nii.gz "${B[@]}" --label-map '>0:1' --split-axis y --val-fraction 0.001
# Damaged headers (issue 35): refused before any voxel is read, naming the
# field; the unit tests (nifti_header_test.cpp) patch every field.
/usr/bin/python3 -c 'import nibabel, h5py' 2>/dev/null ||
  fail "python3-nibabel and python3-h5py are needed (bash launch/install_deps.sh)"
/usr/bin/python3 - "$T" <<'PYEOF' || fail "building the damaged files"
import struct, sys, gzip
import numpy as np, nibabel as nib
t = sys.argv[1]
img = nib.load(f"{t}/ch2.nii.gz")
lbl = nib.load(f"{t}/ch2bet.nii.gz")
# 4 mm: 46 x 55 x 46; small files.
i4 = np.asarray(img.dataobj)[::4, ::4, ::4].astype(np.float32)
l4 = (np.asarray(lbl.dataobj)[::4, ::4, ::4] > 0).astype(np.uint8)
zooms = (4.0, 4.0, 4.0)
for name, data in (("img4", i4), ("lbl4", l4)):
    # Analyze 7.5 pairs (nibabel's AnalyzeImage: LAS, centred) and their
    # NIfTI twins with the same affine.
    a = nib.AnalyzeImage(data, None)
    a.header.set_zooms(zooms)
    nib.save(a, f"{name}.hdr")
    aff = nib.load(f"{name}.hdr").affine
    n = nib.Nifti1Image(data, aff)
    n.set_qform(aff, 1)
    n.set_sform(aff, 1)
    nib.save(n, f"{name}.nii")
raw = bytearray(open("img4.nii", "rb").read())
struct.pack_into("<f", raw, 88, 0.0)  # pixdim[3]
open("pixdim0.nii", "wb").write(raw)
raw = bytearray(open("img4.nii", "rb").read())
raw[344:348] = b"\0\0\0\0"  # no magic
open("nomagic.nii.gz", "wb").write(gzip.compress(bytes(raw)))
PYEOF
expect_error "--image 'pixdim0.nii': pixdim[3] = 0; the voxel size of a spatial axis must be finite and > 0" \
  --image pixdim0.nii --labels lbl4.nii --out x.h5
expect_error "--image 'nomagic.nii.gz': no NIfTI magic" \
  --image nomagic.nii.gz --labels lbl4.nii --out x.h5
expect_error "--image 'img4.hdr': no NIfTI magic" --image img4.hdr --labels lbl4.hdr --out x.h5
expect_error "--analyze-orientation 'LPX' is not an axis code" \
  --image img4.hdr --labels lbl4.hdr --out x.h5 --analyze-orientation LPX
expect_error "--analyze-orientation RAS is given but neither --image 'img4.nii' nor --labels 'lbl4.nii' is an Analyze 7.5 file" \
  --image img4.nii --labels lbl4.nii --out x.h5 --analyze-orientation RAS
# The Analyze image against its NIfTI twin's labels: compared with the
# orientation given (RAS would mirror it: refused).
expect_error "different voxel-to-world transforms" \
  --image img4.hdr --labels lbl4.nii --out x.h5 --analyze-orientation RAS
"$MEMTRAIN" convert-nifti --image img4.hdr --labels lbl4.nii --out analyze.h5 \
  --analyze-orientation LAS >/dev/null || fail "Analyze with --analyze-orientation LAS"
"$MEMTRAIN" convert-nifti --image img4.nii --labels lbl4.nii --out twin.h5 >/dev/null ||
  fail "the NIfTI twin"
/usr/bin/python3 - <<'PYEOF' || fail "the Analyze pair converts as its NIfTI twin"
import h5py, numpy as np, nibabel as nib
a, t = h5py.File("analyze.h5"), h5py.File("twin.h5")
want = np.asarray(nib.load("img4.hdr").dataobj).astype(np.float32)
assert np.array_equal(a["volumes"][0, 0], want.T), "not nibabel's AnalyzeImage voxels"
assert np.array_equal(a["volumes"][()], t["volumes"][()])
assert np.array_equal(a["masks"][()], t["masks"][()])
print("ok: Analyze pair with --analyze-orientation LAS == its NIfTI twin")
PYEOF
# Resampling: 0 is no voxel size; a grid beyond memory is named up front.
expect_error "--resample 0 must be a positive voxel size in mm" \
  --image img4.nii --labels lbl4.nii --out x.h5 --resample 0
expect_error "--resample 1e-06 makes a 184000000x220000000x184000000 grid" \
  --image img4.nii --labels lbl4.nii --out x.h5 --resample 1e-6
# With --ignore-affine the flipped pair converts (the user vouches for it).
"$MEMTRAIN" convert-nifti --image $T/AICHAmc.nii.gz --ignore-affine \
  --labels $T/JHU-WhiteMatter-labels-2mm.nii.gz --out flipped.h5 >/dev/null ||
  fail "--ignore-affine"
# No failed run touched an output or left a temporary file.
cmp -s keep.h5 brain/brain-train.h5 || fail "a failed run changed brain-train.h5"
[ ! -e brain/brain.h5 ] && [ ! -e x.h5 ] || fail "a failed run wrote an output"
! ls ./*.tmp.* brain/*.tmp.* 2>/dev/null || fail "temporary files left"
# A bad flag value is a usage error too.
rc=0; "$MEMTRAIN" convert-nifti --image a --labels b --out c --val-fraction abc \
  >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "bad flag: exit $rc"
echo "e2e convert_nifti: ok"
