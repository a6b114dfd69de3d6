#!/usr/bin/env bash
# model.feature_cache=host (issue 54, point 8; Note [The feature cache] in
# src/model/feature_cache.cpp): the frozen DINOv3's maps of each slice (and
# of its context crop) kept in host memory, keyed by where the slice was
# cut from, copied back instead of extracted again.
# 1. Patches as large as the volumes (8x32x32), context x2, one rank, no
#    flips: every window of epoch 1 extracts its 2 x 8 x 2 slices (all
#    misses), every window after finds them all (32 hits, no miss); the
#    first validation extracts its 4 cases' 64 slices, the second finds
#    them; the host plan's "feature cache" holder is exactly the 32
#    training and 32 validation slices x 2 views x 4 KiB (tiny: 4 layers x
#    64 x 2 x 2 floats, one block of 512 KiB), and the cache ends holding
#    that. The run equals
#    the run without the cache: losses, val Dice and the head to float32
#    rounding (hits are the maps of another batch of slices).
# 2. Patches of 8x16x16 in 32x32 slices, 2 ranks: training cannot hit (said
#    once; every slice a miss), validation can: rank 0's 2 cases x 9
#    windows x 8 slices x 2 views extracted in the first validation, found
#    in the second; the holder charges the one block they fill (512 KiB,
#    the power of two above their 288 KiB).
# 3. A model without a frozen extraction refuses the key, exit 2.
source "$(dirname "$0")/common.sh"

for split in train val; do
  "$MEMTRAIN" make-data --kind volumes --out $split.h5 --samples 4 --channels 1 \
    --depth 8 --height 32 --width 32 --classes 3 --noise 0.5 --split $split \
    --chunk 4 >/dev/null || fail "make-data $split"
done
common=(--data.train=train.h5 --data.val=val.h5 --model.name=dinov3 --model.variant=tiny
  --model.context.scale=2 --data.patches_per_volume=1 --data.batch_size=2
  --training.effective_batch_size=2 --training.optimizer=sgd --training.lr=0.05
  --training.epochs=4 --validation.every_epochs=2 --data.flip=none
  --validation.sw_batch=3)

# 1. The whole slice plane: training and validation hit.
train_common 1 cached --data.patch_size=[8,32,32] --model.feature_cache=host
train_common 1 plain --data.patch_size=[8,32,32] --model.feature_cache=none
said=$(grep -c "spans the slice plane of every training volume" cached.log || true)
[ "$said" = 1 ] || { cat cached.log; fail "the spanning patches are said $said times, not once"; }
"$PY" - "$PEER_SCRIPTS" <<'EOF' || fail "1: see above"
import json, sys
sys.path.insert(0, sys.argv[1])
import safetensors_read
def rows(d):
    return [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
def tensors(path):  # name -> list of floats, by the independent reader
    return {k: v[2] for k, v in safetensors_read.load(path)[0].items()}
c, p = rows("cached"), rows("plain")
wins = [r for r in c if r["type"] == "window"]
vals = [r for r in c if r["type"] == "validation"]
assert len(wins) == 8, len(wins)
for w in wins:
    want = (0, 32) if w["epoch"] == 0 else (32, 0)
    got = (w["feature_cache_hits"], w["feature_cache_misses"])
    assert got == want, (w["epoch"], w["step"], got, want)
assert wins[-1]["feature_cache_bytes"] == 524288, wins[-1]["feature_cache_bytes"]
assert [(v["val_feature_cache_hits"], v["val_feature_cache_misses"]) for v in vals] == \
    [(0, 64), (64, 0)], vals
plan = json.load(open("cached/memory_plan.json"))
holders = {h["name"]: h for h in plan["host_holders"]}
h = holders["feature cache"]
assert h["bytes"] == (32 + 32) * 2 * 4096, h
assert "32 training and 32 validation slices" in h["how"], h
pw = [r for r in p if r["type"] == "window"]
pv = [r for r in p if r["type"] == "validation"]
assert "feature_cache_hits" not in pw[0], pw[0]
for a, b in zip(wins, pw):
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a["step"], a["loss"], b["loss"])
for a, b in zip(vals, pv):
    assert abs(a["val_dice"] - b["val_dice"]) <= 1e-6, (a["val_dice"], b["val_dice"])
ca, pa = tensors("cached/model.safetensors"), tensors("plain/model.safetensors")
for k in ("head.weight", "head.bias"):
    top = max(abs(v) for v in pa[k])
    diff = max(abs(x - y) for x, y in zip(ca[k], pa[k]))
    assert diff <= 1e-5 * top, (k, diff, top)
print(f"1: epoch 1 {wins[0]['feature_cache_misses']} misses a window, then "
      f"{wins[-1]['feature_cache_hits']} hits; validation (0, 64) then (64, 0); "
      f"holder {h['bytes']} B; head equal to the uncached run's")
EOF

# 2. Patches smaller than the slices: validation only, at 2 ranks.
train_common 2 val_only --data.patch_size=[8,16,16] --model.feature_cache=host
said=$(grep -c "does not span the slice plane of training volume" val_only.log || true)
[ "$said" = 1 ] || { cat val_only.log; fail "the random plane crops are said $said times, not once"; }
"$PY" - <<'EOF' || fail "2: see above"
import json
rs = [json.loads(l) for l in open("val_only/metrics.jsonl")]
wins = [r for r in rs if r["type"] == "window"]
vals = [r for r in rs if r["type"] == "validation"]
for w in wins:  # rank 0's sample: 8 slices x 2 views, none kept
    assert (w["feature_cache_hits"], w["feature_cache_misses"]) == (0, 16), w
# Rank 0 validates cases 0 and 2: 3 x 3 windows of 8 slices, 2 views.
assert [(v["val_feature_cache_hits"], v["val_feature_cache_misses"]) for v in vals] == \
    [(0, 288), (288, 0)], vals
h = {h["name"]: h for h in json.load(open("val_only/memory_plan.json"))["host_holders"]}
h = h["feature cache"]
assert h["bytes"] == 524288, h  # 144 x 2 maps of 1 KiB: one block, a power of two
assert "0 training and 144 validation slices" in h["how"], h
print(f"2: training (0, 16) a window; validation (0, 288) then (288, 0); holder {h['bytes']} B")
EOF

# 3. Refused for a model without a frozen extraction.
refused_common unet "has none: set model.feature_cache=none" \
  --model.name=unet3d --model.context.scale=0 --model.feature_cache=host \
  --data.patch_size=[8,32,32]
echo "dinov3_feature_cache: passed"
