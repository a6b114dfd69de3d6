#!/usr/bin/env bash
# A multi-class segmentation task from Debian's mricron-data templates
# (docs/data-convert.md): the AAL atlas's 116 regions grouped into 8 classes by
# lobe, the grouping of AAL's own region codes (aal.nii.txt, 3rd column):
#   0 background
#   1 frontal        AAL  1-28  (codes 2xxx: precentral .. rectus)
#   2 insula_limbic  AAL 29-42  (3xxx insula, 4xxx cingulum, hippocampus,
#                               parahippocampal, amygdala)
#   3 occipital      AAL 43-56  (5xxx: calcarine .. fusiform)
#   4 parietal       AAL 57-70  (6xxx: postcentral .. paracentral lobule)
#   5 subcortical    AAL 71-78  (7xxx: caudate, putamen, pallidum, thalamus)
#   6 temporal       AAL 79-90  (8xxx: Heschl, temporal gyri and poles)
#   7 cerebellum     AAL 91-116 (9xxx: cerebellar hemispheres and vermis)
# image  = ch2.nii.gz (Colin27 T1): the same 181x217x181 1 mm grid and
#          transform as aal.nii.gz (ch2better.nii.gz is 0.5 mm, another grid)
# split  = along x at the midline: validation = the right hemisphere (the
#          last 50% of the x planes), training = the left: every class is
#          in both. A 30% slab would hold no subcortical voxel.
#
# Usage: data/make_aal_dataset.sh [OUTDIR (runs/data/aal)] [MM (3)]
# Writes OUTDIR/aal-train.h5 and OUTDIR/aal-val.h5 and prints their paths.
# MEMTRAIN=path/to/memtrain overrides build/memtrain
# (data/mricron_task.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/mricron_task.sh"
mricron_task aal "${1:-runs/data/aal}" "${2:-3}" ch2.nii.gz aal.nii.gz \
  --label-map '1-28:1,29-42:2,43-56:3,57-70:4,71-78:5,79-90:6,91-116:7' \
  --class-names background,frontal,insula_limbic,occipital,parietal,subcortical,temporal,cerebellum \
  --split-axis x --val-fraction 0.5
