#!/usr/bin/env bash
# model.feature_cache (Note [The feature cache]): the time of an epoch with
# the frozen DINOv3's maps kept in host memory against extracting them
# every epoch, the same run otherwise. Volumes of SLICES x SIDE x SIDE,
# patches as large as the volumes (so training hits too), context x2
# concat, validation every epoch; REPEATS runs of each, alternating.
# Prints per mode the median (min-max over the repeats) of epoch 1's time
# and of the later epochs' (each run's median; validation included, its own
# time beside), and the hits and misses of the last run's windows.
#
#   benchmarks/feature_cache.sh MEMTRAIN [VARIANT SIDE SLICES EPOCHS REPEATS]
#   (defaults: vits16 128 16 3 5; one rank, one thread)
set -euo pipefail
MEMTRAIN=$1
VARIANT=${2:-vits16}
SIDE=${3:-128}
SLICES=${4:-16}
EPOCHS=${5:-3}
REPEATS=${6:-5}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
for split in train val; do
  "$MEMTRAIN" make-data --kind volumes --out $split.h5 --samples 4 --channels 1 \
    --depth "$SLICES" --height "$SIDE" --width "$SIDE" --classes 3 --noise 0.5 \
    --split $split >/dev/null
done
for r in $(seq 1 "$REPEATS"); do
  for mode in none host; do
    OMP_NUM_THREADS=1 "$MEMTRAIN" train --data.train=train.h5 --data.val=val.h5 \
      --model.name=dinov3 --model.variant="$VARIANT" --model.context.scale=2 \
      --data.patch_size="[$SLICES,$SIDE,$SIDE]" --data.patches_per_volume=1 \
      --data.batch_size=2 --training.effective_batch_size=4 \
      --training.epochs="$EPOCHS" --validation.every_epochs=1 --data.flip=none \
      --model.feature_cache=$mode --output.dir="$mode-$r" \
      >"$mode-$r.log" 2>&1
  done
done
python3 - "$REPEATS" "$VARIANT" "$SIDE" "$SLICES" <<'EOF'
import json, statistics, sys
repeats, variant, side, slices = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def spread(xs):
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"
print(f"dinov3 {variant}, context x2 concat, 4 training and 4 validation volumes of "
      f"{slices}x{side}x{side}, one rank, one thread, {repeats} runs a mode")
for mode in ("none", "host"):
    first, later, val = [], [], []
    for r in range(1, repeats + 1):
        rows = [json.loads(l) for l in open(f"{mode}-{r}/metrics.jsonl")]
        ep = [x for x in rows if x["type"] == "epoch"]
        vs = [x for x in rows if x["type"] == "validation"]
        first.append(ep[0]["epoch_s"])
        later.append(statistics.median(e["epoch_s"] for e in ep[1:]))
        val.append(statistics.median(v["val_seconds"] for v in vs[1:]))
        wins = [x for x in rows if x["type"] == "window"]
    counts = ""
    if "feature_cache_hits" in wins[-1]:
        counts = (f"; last run's windows (hits, misses): epoch 1 "
                  f"{[(w['feature_cache_hits'], w['feature_cache_misses']) for w in wins if w['epoch'] == 0]}, "
                  f"last {[(w['feature_cache_hits'], w['feature_cache_misses']) for w in wins if w['epoch'] == wins[-1]['epoch']]}, "
                  f"cache {wins[-1]['feature_cache_bytes']} B; validations (hits, misses) "
                  f"{[(v['val_feature_cache_hits'], v['val_feature_cache_misses']) for v in vs]}")
    print(f"feature_cache={mode}: epoch 1 {spread(first)}, later epochs {spread(later)} "
          f"(of which validation {spread(val)}){counts}")
EOF
