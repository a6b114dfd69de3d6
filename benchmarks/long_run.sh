#!/usr/bin/env bash
# Long runs that must not creep (issues 12 and 53): 2 ranks train, for
# EPOCHS epochs each,
# - brain: the brain-mask task as docs/models.md runs it
#   (launch/configs/brain_mask.yaml unchanged but for the paths and the
#   epochs: a U-Net on the Colin27 files of data/make_brain_dataset.sh,
#   validation every 5 epochs, sums in host memory);
# - seresnext: launch/configs/seresnext50-v100.yaml at 64 x 64 (64
#   training and 16 validation images of 5 classes, micro-batch 8,
#   effective batch 32, AMP off, memory.budget=none: the width kept, the
#   sizes the CPU allows).
# For each: per epoch the largest rank's RSS and counted bytes, the held and
# reserved device-domain bytes (benchmarks/creep.py, the suite's
# tests/e2e/creep.sh uses it too) into long_run_NAME.csv and a plot
# long_run_NAME.png in OUT_DIR; the slope of each after the warm-up is
# printed, and the script fails if one creeps or a leak warning was
# printed.
#   benchmarks/long_run.sh [EPOCHS (200)] [OUT_DIR (.)] [BUILD_DIR] [TASKS (brain,seresnext)]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
epochs=${1:-200}
out=$(mkdir -p "${2:-.}" && cd "${2:-.}" && pwd)
build=$(cd "${3:-$here/build}" && pwd)
tasks=${4:-brain,seresnext}
source "$here/launch/env.sh"
work=$(mktemp -d /tmp/long_run-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

train() {  # NAME ARGS...
  local name=$1 start=$SECONDS
  shift
  mpirun --oversubscribe -np 2 "$build/memtrain" train "$@" \
    --training.epochs="$epochs" --output.dir="$name" >"$name.log" 2>&1 ||
    { tail -30 "$name.log"; exit 1; }
  echo "long_run $name: $epochs epochs, 2 ranks, $((SECONDS - start)) s"
  if grep "possible memory leak" "$name.log"; then
    echo "long_run $name: a leak warning was printed" >&2
    exit 1
  fi
  python3 "$here/benchmarks/creep.py" "$name/metrics.jsonl" \
    --csv "$out/long_run_$name.csv" --png "$out/long_run_$name.png" \
    --title "$name: $epochs epochs, 2 ranks (largest rank)"
}

if [[ ,$tasks, == *,brain,* ]]; then
  MEMTRAIN="$build/memtrain" "$here/data/make_brain_dataset.sh" brain 3 >paths.txt
  train brain --config "$here/launch/configs/brain_mask.yaml" \
    --data.train="$(sed -n 1p paths.txt)" --data.val="$(sed -n 2p paths.txt)"
fi
if [[ ,$tasks, == *,seresnext,* ]]; then
  "$build/memtrain" make-data --kind images --samples 64 --channels 3 \
    --height 64 --width 64 --classes 5 --dtype uint8 --out train.h5 >/dev/null
  "$build/memtrain" make-data --kind images --samples 16 --channels 3 \
    --height 64 --width 64 --classes 5 --dtype uint8 --split val \
    --out val.h5 >/dev/null
  train seresnext --config "$here/launch/configs/seresnext50-v100.yaml" \
    --data.train=train.h5 --data.val=val.h5 --data.batch_size=8 \
    --data.read_threads=1 --training.effective_batch_size=32 \
    --training.amp=off --memory.budget=none
fi
