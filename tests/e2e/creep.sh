#!/usr/bin/env bash
# Memory that creeps (issue 53, point 6; benchmarks/long_run.sh runs 200
# epochs of the seeds' tasks): 2 ranks train a U-Net (instance norm,
# AdamW, the patch prefetcher, validation every 5 epochs with the sums in
# host memory) for 30 epochs under memory.budget=256MiB; after the warm-up
# (the first validation's epoch: its buffers are a step, not a creep) the
# least-squares slope of the largest rank's resident set, counted, held
# and reserved bytes per epoch is 0 within noise (benchmarks/creep.py: a
# creep is a slope over 3 standard errors from 0 and over 1 MiB across the
# fit; measured on the development VM, two runs: RSS +6 and +5 KiB/epoch,
# standard errors 2 and 6, under 0.2 MiB across 25 epochs; counted, held
# and reserved flat to the byte). The detector can fail: the same run leaking 64 KiB of device
# memory a window (memory.test_leak_kib_per_window) is reported creeping.
REPO=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/common.sh"

mkvol() {  # OUT SAMPLES SPLIT
  "$MEMTRAIN" make-data --kind volumes --out "$1" --samples "$2" --channels 1 \
    --depth 32 --height 32 --width 32 --classes 3 --noise 0.7 --split "$3" \
    --chunk 16 >/dev/null || fail "make-data $1"
}
mkvol train.h5 8 train
mkvol val.h5 2 val
run() {  # NAME EPOCHS ARGS...
  local name=$1 epochs=$2
  shift 2
  mpi -np 2 "$MEMTRAIN" train --data.train=train.h5 --data.val=val.h5 \
    --model.name=unet3d --model.feature_size=8 --model.depth=3 \
    --model.norm=instance --data.patch_size=16 --data.patches_per_volume=8 \
    --training.effective_batch_size=16 --data.batch_size=4 \
    --training.optimizer=adamw --training.lr=0.003 --training.epochs="$epochs" \
    --validation.every_epochs=5 --memory.budget=256MiB --output.dir="$name" \
    "$@" >"$name.log" 2>&1 || { tail -20 "$name.log"; fail "$name"; }
}

start=$SECONDS
run steady 30
echo "30 epochs: $((SECONDS - start)) s"
"$PY" "$REPO/benchmarks/creep.py" steady/metrics.jsonl --csv steady.csv ||
  fail "memory creeps over 30 epochs"

# 12 epochs leaking 64 KiB a window (4 windows an epoch): 1.5 MiB over the
# fit (epochs 6-12). creep.py exits 3 for a creep, other codes for errors.
run leaky 12 --memory.test_leak_kib_per_window=64
rc=0
"$PY" "$REPO/benchmarks/creep.py" leaky/metrics.jsonl --check counted,held || rc=$?
[ "$rc" = 3 ] || fail "a leak of 64 KiB a window: creep.py exit $rc, not 3 (a creep)"
echo "the injected leak is reported"
