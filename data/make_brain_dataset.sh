#!/usr/bin/env bash
# The brain-mask task from Debian's mricron-data templates (docs/data-convert.md):
# image  = ch2.nii.gz    (Colin27 T1, 181x217x181, 1 mm, MNI)
# labels = ch2bet.nii.gz (ch2 skull-stripped, same grid): brain = ch2bet > 0
# split  = along x (left-right): validation = the last 30% of the x planes
#          (the right-lateral slab), training = the rest; no overlap.
#
# Usage: data/make_brain_dataset.sh [OUTDIR (runs/data/brain)] [MM (3)]
# Writes OUTDIR/brain-train.h5 and OUTDIR/brain-val.h5 (MM mm voxels) and
# prints their paths. MEMTRAIN=path/to/memtrain overrides build/memtrain
# (data/mricron_task.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mricron_task.sh"
mricron_task brain "${1:-runs/data/brain}" "${2:-3}" ch2.nii.gz ch2bet.nii.gz \
  --label-map '>0:1' \
  --class-names background,brain \
  --split-axis x --val-fraction 0.3 --chunk 16
