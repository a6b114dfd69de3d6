#!/usr/bin/env bash
# Bad disks and bad HDF5 files (issue 35, points 2, 3, 5, 6).
# 1. A full file system: every writer (convert-nifti, convert-dataset,
#    convert-images, convert-captions, make-data, a training run's
#    checkpoint) writing onto a small tmpfs, in a private mount namespace,
#    ends with no signal, one error line naming the file and "No space
#    left on device" (never an empty reason), no temporary file left, and
#    an existing output byte for byte as it was; exit 2, or 1 for training
#    (a runtime I/O failure: the job is ended by MPI_Abort, as for any
#    error once training runs). convert-images and convert-captions at
#    --size 224 write their rows past HDF5's chunk cache, so the append
#    itself fails (issue 56, point 6: its reason was lost); at --size 64
#    the rows fail when the cache is flushed.
# 2. An HDF5 file declaring /features [2^36, 16] (never written, a few KB):
#    train and inspect refuse it naming the dataset, its shape and its
#    bytes (never std::bad_alloc).
# 3. A truncated HDF5 file: train's refusal carries HDF5's reason
#    ("truncated file: eof = ...") and points at `inspect --verify`.
# 4. A writer killed with SIGKILL leaves NAME.tmp.PID; the next writer of
#    the folder removes it, saying so; a live process's file stays.
# Needs `unshare -m` and tmpfs mounts (root): without them, says why and
# exits 77 (ctest: skipped).
source "$(dirname "$0")/common.sh"
PYN=/usr/bin/python3  # Debian's: nibabel, PIL, h5py, numpy
"$PYN" -c 'import nibabel, PIL, h5py, numpy' 2>/dev/null ||
  fail "python3-nibabel, python3-pil and python3-h5py are needed (bash launch/install_deps.sh)"

mkdir -p disk
if ! why=$(unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs disk' 2>&1); then
  echo "SKIP (machine): no private mount namespace with a tmpfs here (unshare -m;" \
    "mount -t tmpfs): ${why:-not permitted}"
  cd / && rm -rf "$WORK"
  exit 77
fi

# Inputs, on the real disk.
"$PYN" - <<'PYEOF'
import json, os
import numpy as np, nibabel as nib
from PIL import Image
rng = np.random.default_rng(3)
aff = np.diag([2.0, 2.0, 2.0, 1.0])
img = (rng.normal(size=(40, 40, 40)) + 2).astype(np.float32)
lbl = (rng.random((40, 40, 40)) > 0.5).astype(np.uint8)
nib.save(nib.Nifti1Image(img, aff), "img.nii.gz")
nib.save(nib.Nifti1Image(lbl, aff), "lbl.nii.gz")
os.makedirs("nn/imagesTr"); os.makedirs("nn/labelsTr")
for c in ["a", "b", "c", "d"]:
    nib.save(nib.Nifti1Image(img, aff), f"nn/imagesTr/case_{c}_0000.nii.gz")
    nib.save(nib.Nifti1Image(lbl, aff), f"nn/labelsTr/case_{c}.nii.gz")
json.dump({"channel_names": {"0": "T1"}, "labels": {"background": 0, "x": 1},
           "numTraining": 4, "file_ending": ".nii.gz"},
          open("nn/dataset.json", "w"))
for k in ["cat", "dog"]:
    os.makedirs(f"pics/{k}")
    for i in range(40):
        a = rng.integers(0, 255, size=(64, 64, 3), dtype=np.uint8)
        Image.fromarray(a).save(f"pics/{k}/{i}.png")
with open("caps.csv", "w") as f:
    f.write("filepath\ttitle\n")
    for k in ["cat", "dog"]:
        for i in range(40):
            f.write(f"pics/{k}/{i}.png\ta photo of a {k}, number {i}\n")
# A CLIP BPE vocabulary of the right length (open_clip's 48894 merges),
# so that the test needs no open_clip: the ids do not matter here.
import gzip
with gzip.open("vocab.txt.gz", "wt") as f:
    f.write("#version: 0.2\n" + "a b\n" * 48894)
PYEOF

# on_full_disk RC SIZE OLD CMD...: runs CMD in a private mount namespace
# over a fresh tmpfs of SIZE at ./disk that holds disk/OLD, an existing
# output, first; then checks the verdict (exit status RC, err.txt).
on_full_disk() {
  local want=$1 size=$2 old=$3
  shift 3
  rm -f out.txt err.txt rc.txt ls.txt sums.txt
  unshare -m bash -c '
    mount -t tmpfs -o "size=$1" tmpfs disk || exit 3
    old=$2
    head -c 2000 /dev/urandom >"disk/$old"
    md5sum <"disk/$old" >sums.txt
    shift 2
    rc=0
    "$@" >out.txt 2>err.txt || rc=$?
    echo "$rc" >rc.txt
    find disk >ls.txt
    md5sum <"disk/$old" >>sums.txt 2>/dev/null || echo gone >>sums.txt
  ' bash "$size" "$old" "$@" || fail "$*: unshare"
  local rc what="$*"
  rc=$(cat rc.txt)
  [ "$rc" = "$want" ] || { cat out.txt err.txt; fail "$what: exit $rc, want $want"; }
  local re='^memtrain: (\[rank 0, [^]]*\] )?error:'
  [ "$(grep -cE "$re" err.txt)" = 1 ] ||
    { cat err.txt; fail "$what: want one error line"; }
  ! grep -E "$re" err.txt | grep -qE ':[[:space:]]*$' ||
    { cat err.txt; fail "$what: the reason is empty"; }
  grep -E "$re" err.txt | grep -q "No space left on device" ||
    { cat err.txt; fail "$what: the reason is not said"; }
  grep -E "$re" err.txt | grep -q "'[^']*disk/[^']*'" ||
    { cat err.txt; fail "$what: no file on the full disk named"; }
  ! grep -q '\.tmp' ls.txt || { cat ls.txt; fail "$what: a temporary file is left"; }
  [ "$(sort -u sums.txt | wc -l)" = 1 ] || fail "$what: the existing disk/$old changed"
  echo "full disk: $(grep -E "$re" err.txt)"
}

on_full_disk 2 200k o.h5 \
  "$MEMTRAIN" convert-nifti --image img.nii.gz --labels lbl.nii.gz --out disk/o.h5
on_full_disk 2 200k o-train.h5 \
  "$MEMTRAIN" convert-dataset --folder nn --out disk/o --val-fraction 0.5
on_full_disk 2 200k p.h5 \
  "$MEMTRAIN" convert-images --folder pics --out disk/p.h5 --size 64 --val-fraction 0.25
on_full_disk 2 200k p.h5 \
  "$MEMTRAIN" convert-images --folder pics --out disk/p.h5 --size 224 --val-fraction 0.25
on_full_disk 2 200k c.h5 \
  "$MEMTRAIN" convert-captions --csv caps.csv --out disk/c.h5 --bpe vocab.txt.gz \
  --size 64 --val-fraction 0.25
on_full_disk 2 200k c.h5 \
  "$MEMTRAIN" convert-captions --csv caps.csv --out disk/c.h5 --bpe vocab.txt.gz \
  --size 224 --val-fraction 0.25
on_full_disk 2 200k f.h5 \
  "$MEMTRAIN" make-data --kind features --out disk/f.h5 --samples 100000
"$MEMTRAIN" make-data --kind features --out train.h5 --samples 256 >/dev/null
on_full_disk 1 400k other.bin \
  "$MEMTRAIN" train --data.train=train.h5 --data.val= --output.dir=disk \
  --model.hidden=2048 --model.depth=2 --training.epochs=1 --data.batch_size=64

# 2. Declared far beyond what the file holds.
"$MAKE_BAD_H5" declared-huge huge.h5
[ "$(stat -c %s huge.h5)" -lt 100000 ] || fail "huge.h5 is not small"
rc=0
"$MEMTRAIN" train --data.train=huge.h5 --data.val= --output.dir=run1 \
  >out.txt 2>err.txt || rc=$?
[ "$rc" = 2 ] || { cat err.txt; fail "train huge.h5: exit $rc, want 2"; }
grep -q "'huge.h5' dataset '/features': declares \[68719476736,16\] float32, 4398046511104 bytes (4.0 TiB)" err.txt ||
  { cat err.txt; fail "train huge.h5: not refused by its declared size"; }
! grep -q "bad_alloc" err.txt || fail "train huge.h5: bad_alloc"
rc=0
"$MEMTRAIN" inspect huge.h5 >out.txt 2>err.txt || rc=$?
[ "$rc" = 2 ] || { cat out.txt err.txt; fail "inspect huge.h5: exit $rc, want 2"; }
grep -q "never written" out.txt || { cat out.txt; fail "inspect huge.h5"; }
echo "declared: $(grep -o 'declares.*' err.txt out.txt | head -1)"

# 3. Truncated.
"$MEMTRAIN" make-data --kind features --out cut.h5 --samples 2048 >/dev/null
size=$(stat -c %s cut.h5)
truncate -s $((size / 2)) cut.h5
rc=0
"$MEMTRAIN" train --data.train=cut.h5 --data.val= --output.dir=run2 \
  >out.txt 2>err.txt || rc=$?
[ "$rc" = 2 ] || { cat err.txt; fail "train cut.h5: exit $rc, want 2"; }
grep -q "truncated file: eof = $((size / 2))" err.txt ||
  { cat err.txt; fail "train cut.h5: HDF5's reason is not said"; }
grep -q "memtrain inspect --verify cut.h5" err.txt ||
  { cat err.txt; fail "train cut.h5: inspect --verify not offered"; }
rc=0
"$MEMTRAIN" inspect --verify cut.h5 >out.txt 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "truncated file" out.txt ||
  { cat out.txt; fail "inspect --verify cut.h5: exit $rc"; }
echo "truncated: $(grep 'memtrain: error:' err.txt)"

# 4. A killed writer's temporary file: the next writer of the folder
# removes it; a live process's stays.
mkdir -p stale
sh -c 'exit 0' &
dead=$!
wait "$dead"
sleep 300 &
live=$!
echo partial >"stale/f.h5.tmp.$dead"
echo partial >"stale/model.safetensors.tmp.$dead"
echo partial >"stale/g.h5.tmp.$live"
echo partial >"stale/young.h5.tmp.$dead"  # newer than the writer: kept
touch -d '-1 hour' "stale/f.h5.tmp.$dead" "stale/model.safetensors.tmp.$dead" \
  "stale/g.h5.tmp.$live"
"$MEMTRAIN" make-data --kind features --out stale/f.h5 --samples 64 \
  >out.txt 2>err.txt || { kill "$live"; cat err.txt; fail "make-data stale"; }
kill "$live"
[ ! -e "stale/f.h5.tmp.$dead" ] && [ ! -e "stale/model.safetensors.tmp.$dead" ] ||
  fail "a dead writer's temporary file is left"
[ -e "stale/g.h5.tmp.$live" ] || fail "a live process's temporary file was removed"
[ -e "stale/young.h5.tmp.$dead" ] || fail "a file newer than the writer was removed"
[ "$(grep -c "removed stale temporary file 'stale/.*\.tmp\.$dead' (its writer, process $dead, no longer runs)" err.txt)" = 2 ] ||
  { cat err.txt; fail "the removals are not said"; }
echo "stale: $(head -1 err.txt)"
echo "full_disk: ok"
