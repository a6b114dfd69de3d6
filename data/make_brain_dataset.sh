#!/usr/bin/env bash
# The brain-mask task from Debian's mricron-data templates (data/CONVERT.md):
# image  = ch2.nii.gz    (Colin27 T1, 181x217x181, 1 mm, MNI)
# labels = ch2bet.nii.gz (ch2 skull-stripped, same grid): brain = ch2bet > 0
# split  = along x (left-right): validation = the last 30% of the x planes
#          (the right-lateral slab), training = the rest; no overlap.
#
# Usage: data/make_brain_dataset.sh [OUTDIR (runs/data/brain)] [MM (3)]
# Writes OUTDIR/brain-train.h5 and OUTDIR/brain-val.h5 (MM mm voxels) and
# prints their paths. MEMTRAIN=path/to/memtrain overrides build/memtrain.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${1:-runs/data/brain}
MM=${2:-3}
MEMTRAIN=${MEMTRAIN:-$REPO/build/memtrain}
TEMPLATES=${MRICRON_TEMPLATES:-/usr/share/mricron/templates}
me=$(basename "$0")

[ -x "$MEMTRAIN" ] || {
  echo "$me: no memtrain executable at '$MEMTRAIN' (build it, or set MEMTRAIN=...)" >&2
  exit 1
}
for f in ch2.nii.gz ch2bet.nii.gz; do
  [ -f "$TEMPLATES/$f" ] || {
    echo "$me: '$TEMPLATES/$f' is missing: the mricron-data templates are needed (apt-get install mricron-data)" >&2
    exit 1
  }
done

mkdir -p "$OUTDIR"
"$MEMTRAIN" convert-nifti \
  --image "$TEMPLATES/ch2.nii.gz" \
  --labels "$TEMPLATES/ch2bet.nii.gz" \
  --label-map '>0:1' \
  --class-names background,brain \
  --split-axis x --val-fraction 0.3 \
  --resample "$MM" \
  --out "$OUTDIR/brain.h5" >&2
echo "$OUTDIR/brain-train.h5"
echo "$OUTDIR/brain-val.h5"
