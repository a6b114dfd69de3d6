#!/usr/bin/env bash
# A long run that must not creep (issue 12): seresnext50_32x4d from
# launch/configs/seresnext50-v100.yaml at 64 x 64 (width kept), 40 epochs
# on 2 ranks, the memory monitor on (memory.leak_warn_mib 8 over 3 epochs,
# the defaults). Prints the distinct device bytes held at epoch ends and
# each window's peak, and fails if a leak warning was printed or the held
# bytes grew after the first epoch.
#   benchmarks/long_run.sh [EPOCHS] [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
epochs=${1:-40}
build=${2:-$here/build}
source "$here/launch/env.sh"
work=$(mktemp -d /tmp/long_run-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$build/memtrain" make-data --kind images --samples 128 --channels 3 \
  --height 64 --width 64 --classes 5 --dtype uint8 --out train.h5 >/dev/null
"$build/memtrain" make-data --kind images --samples 32 --channels 3 \
  --height 64 --width 64 --classes 5 --dtype uint8 --split val \
  --out val.h5 >/dev/null
start=$SECONDS
mpirun --oversubscribe -np 2 "$build/memtrain" train \
  --config "$here/launch/configs/seresnext50-v100.yaml" \
  --data.train=train.h5 --data.val=val.h5 --data.batch_size=8 \
  --data.read_threads=1 --training.effective_batch_size=32 \
  --training.amp=off --memory.budget=none --training.epochs="$epochs" \
  --output.dir=run >train.log 2>&1 || { tail -30 train.log; exit 1; }
echo "long_run: $epochs epochs, 2 ranks, $((SECONDS - start)) s"
if grep "possible memory leak" train.log; then
  echo "long_run: a leak warning was printed" >&2
  exit 1
fi
python3 - run/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
epochs = [r for r in recs if r["type"] == "epoch"]
windows = [r for r in recs if r["type"] == "window"]
held = [r["mem_held"] for r in epochs]
print(f"epochs {len(epochs)}; mem_held at epoch ends (bytes): {sorted(set(held))}")
print(f"window mem_peak (bytes): min {min(r['mem_peak'] for r in windows)}, "
      f"max {max(r['mem_peak'] for r in windows)}")
if max(held[1:], default=held[0]) > held[0]:
    sys.exit("long_run: mem_held grew after the first epoch")
PY
