# Sourced by make_brain_dataset.sh and make_aal_dataset.sh: converts a pair
# of Debian mricron-data templates into OUTDIR/NAME-train.h5 and
# OUTDIR/NAME-val.h5 (MM mm voxels) and prints the two paths.
#   mricron_task NAME OUTDIR MM IMAGE LABELS [convert-nifti options...]
# MEMTRAIN=path/to/memtrain overrides build/memtrain; MRICRON_TEMPLATES
# overrides /usr/share/mricron/templates.
mricron_task() {
  local name=$1 outdir=$2 mm=$3 image=$4 labels=$5
  shift 5
  local repo memtrain templates me f
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  memtrain=${MEMTRAIN:-$repo/build/memtrain}
  templates=${MRICRON_TEMPLATES:-/usr/share/mricron/templates}
  me=$(basename "$0")
  [ -x "$memtrain" ] || {
    echo "$me: no memtrain executable at '$memtrain' (build it, or set MEMTRAIN=...)" >&2
    exit 1
  }
  for f in "$image" "$labels"; do
    [ -f "$templates/$f" ] || {
      echo "$me: '$templates/$f' is missing: the mricron-data templates are needed (apt-get install mricron-data)" >&2
      exit 1
    }
  done
  mkdir -p "$outdir"
  "$memtrain" convert-nifti \
    --image "$templates/$image" \
    --labels "$templates/$labels" \
    --resample "$mm" \
    --out "$outdir/$name.h5" "$@" >&2
  echo "$outdir/$name-train.h5"
  echo "$outdir/$name-val.h5"
}
