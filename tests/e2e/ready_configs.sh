#!/usr/bin/env bash
# The ready 16 GB configs of launch/configs/ start and run one window on
# 2 ranks, on tiny data from make-data (paths and sizes overridden; the
# memory budget, batch_size: auto, accumulation and checkpointing auto as
# written; AMP off: fp16 needs a CUDA build):
# - seresnext50-v100.yaml: effective batch 64 = 2 ranks x steps x the
#   planned micro-batch, 16 bottleneck segments, a validation accuracy;
# - unet3d-v100.yaml: effective batch 8, its 9 segments planned,
#   whole-volume validation with a Dice (validation.every_epochs 1, so
#   that the one epoch validates);
# - swin-unetr-v100.yaml: the same at feature size 12 on 64x32x32 patches
#   (multiples of 32), its 18 segments planned;
# - fewshot-v100.yaml: one window of 8 few-shot episodes (cosine transformer
#   on resnet50) at 40 x 40;
# - clip-v100.yaml: one window of 96 caption pairs through open_clip's
#   ViT-B-32 towers (micro-batch 8 given), one contrastive batch.
# - dino-context-v100.yaml: one window of 16 patches through DINOv3 ViT-B/16
#   (random weights: model.pretrained emptied) on 4 x 32 x 32 patches and
#   their context crops, the micro-batch and model.slice_chunk planned
#   under the budget, only the head all-reduced (2 x 4 x 768 x 2 + 2
#   floats and the window's totals), whole-volume validation with both
#   extractions and a Dice.
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/common.sh"

record() {  # FILE TYPE KEY: the KEY of the first record of TYPE
  "$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("type") == sys.argv[2]:
        print(r[sys.argv[3]]); break' "$@"
}

"$MEMTRAIN" make-data --kind images --samples 64 --channels 3 --height 64 \
  --width 64 --classes 5 --dtype uint8 --out im.h5 >/dev/null
"$MEMTRAIN" make-data --kind images --samples 16 --channels 3 --height 64 \
  --width 64 --classes 5 --dtype uint8 --split val --out im-val.h5 >/dev/null
mpi -np 2 "$MEMTRAIN" train --config "$ROOT/launch/configs/seresnext50-v100.yaml" \
  --data.train=im.h5 --data.val=im-val.h5 --data.read_threads=1 \
  --training.amp=off --training.max_windows=1 \
  --output.dir=seresnext >seresnext.log 2>&1 || { tail -30 seresnext.log; fail "seresnext50-v100.yaml"; }
grep -E "^(window|memory plan)" seresnext.log
[ "$(record seresnext/metrics.jsonl window samples)" = 64 ] ||
  fail "seresnext50-v100.yaml: not a window of 64"
grep -q "checkpointing auto: [0-9]*/16 segments" seresnext.log ||
  fail "seresnext50-v100.yaml: not 16 bottleneck segments"
acc=$(record seresnext/metrics.jsonl validation val_accuracy)
"$PY" -c "import sys; a=float(sys.argv[1]); sys.exit(0 if 0<=a<=1 else 1)" "$acc" ||
  fail "seresnext50-v100.yaml: val_accuracy '$acc'"
echo "seresnext50-v100.yaml: one window of 64, val_accuracy $acc"

# fewshot-v100.yaml: the cosine transformer on resnet50, 2 ranks, one window
# of 8 episodes (1-shot, 2 queries: the tiny file has 10 images a class).
"$MEMTRAIN" make-data --kind images --samples 240 --channels 3 --height 40 \
  --width 40 --classes 24 --dtype uint8 --out fs-im.h5 >/dev/null
mpi -np 2 "$MEMTRAIN" train --config "$ROOT/launch/configs/fewshot-v100.yaml" \
  --data.train=fs-im.h5 --data.read_threads=1 --data.episodes.k_shot=1 \
  --data.episodes.n_query=2 --data.episodes.per_epoch=8 --validation.episodes=4 \
  --training.max_windows=1 --output.dir=fsct >fsct.log 2>&1 || { tail -30 fsct.log; fail "fewshot-v100.yaml"; }
grep -E "^(window|memory plan|few-shot)" fsct.log
[ "$(record fsct/metrics.jsonl window samples)" = 8 ] || fail "fewshot-v100.yaml: not a window of 8 episodes"
echo "fewshot-v100.yaml: one window of 8 episodes"

# clip-v100.yaml: open_clip's ViT-B-32, both towers, on 224 x 224 images
# and 77-token captions, 2 ranks, one window of 96 pairs as one contrastive
# batch (one all-gather of the embeddings). The micro-batch is given (8):
# the planner's probes of ViT-B-32 take minutes on two CPU cores.
"$MEMTRAIN" make-data --kind captions --samples 96 --height 224 --width 224 \
  --out cap.h5 >/dev/null
mpi -np 2 "$MEMTRAIN" train --config "$ROOT/launch/configs/clip-v100.yaml" \
  --data.train=cap.h5 --data.val= --data.batch_size=8 --data.read_threads=1 \
  --training.max_windows=1 --output.dir=clip >clip.log 2>&1 || { tail -30 clip.log; fail "clip-v100.yaml"; }
grep -E "^(model|window|memory plan)" clip.log
[ "$(record clip/metrics.jsonl window samples)" = 96 ] || fail "clip-v100.yaml: not a window of 96"
[ "$(record clip/metrics.jsonl window allgather_calls)" = 1 ] ||
  fail "clip-v100.yaml: not one all-gather of the window's embeddings"
grep -q "checkpointing auto: [0-9]*/24 segments" clip.log ||
  fail "clip-v100.yaml: not 24 transformer-block segments"
echo "clip-v100.yaml: one window of 96 pairs"

volume_config() {  # CONFIG NAME DEPTH FEATURE SEGMENTS: one window of 8 and a Dice
  local config=$1 name=$2 depth=$3
  "$MEMTRAIN" make-data --kind volumes --samples 4 --channels 1 --depth "$depth" \
    --height 32 --width 32 --classes 2 --out "$name.h5" >/dev/null
  "$MEMTRAIN" make-data --kind volumes --samples 2 --channels 1 --depth "$depth" \
    --height 32 --width 32 --classes 2 --split val --out "$name-val.h5" >/dev/null
  mpi -np 2 "$MEMTRAIN" train --config "$ROOT/launch/configs/$config" \
    --data.train="$name.h5" --data.val="$name-val.h5" --data.read_threads=1 \
    --data.patch_size=["$depth",32,32] --validation.roi=["$depth",32,32] \
    --model.feature_size="$4" --data.patches_per_volume=2 --training.amp=off \
    --training.max_windows=1 --validation.every_epochs=1 \
    --output.dir="$name" >"$name.log" 2>&1 || { tail -30 "$name.log"; fail "$config"; }
  grep -E "^(window|memory plan)" "$name.log"
  [ "$(record "$name/metrics.jsonl" window samples)" = 8 ] || fail "$config: not a window of 8"
  grep -q "checkpointing auto: [0-9]*/$5 segments" "$name.log" ||
    fail "$config: not the model's $5 segments"
  local dice
  dice=$(record "$name/metrics.jsonl" validation val_dice)
  "$PY" -c "import sys; d=float(sys.argv[1]); sys.exit(0 if 0<=d<=1 else 1)" "$dice" ||
    fail "$config: val_dice '$dice'"
  echo "$config: one window of 8, val_dice $dice"
}
# dino-context-v100.yaml: vitb16 with random weights at 32 x 32 slices
# (2 x 2 tokens): the planner's probes of the micro-batch and the chunk run
# the backbone on the CPU in seconds.
for split in train val; do
  "$MEMTRAIN" make-data --kind volumes --samples 4 --channels 1 --depth 8 \
    --height 32 --width 32 --classes 2 --split $split --out dino-$split.h5 >/dev/null
done
mpi -np 2 "$MEMTRAIN" train --config "$ROOT/launch/configs/dino-context-v100.yaml" \
  --model.pretrained= --data.train=dino-train.h5 --data.val=dino-val.h5 \
  --data.read_threads=1 --data.patch_size=[4,32,32] --validation.roi=[4,32,32] \
  --data.patches_per_volume=4 --training.amp=off --training.max_windows=1 \
  --validation.every_epochs=1 --output.dir=dino >dino.log 2>&1 || { tail -30 dino.log; fail "dino-context-v100.yaml"; }
grep -E "^(model|window|memory plan)" dino.log
grep -q "model.slice_chunk auto: [0-9]* of the micro-batch's [0-9]* slices a backbone call" dino.log ||
  fail "dino-context-v100.yaml: no planned model.slice_chunk"
"$PY" - dino <<'EOF' || fail "dino-context-v100.yaml: see above"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
w = next(r for r in rows if r["type"] == "window")
v = next(r for r in rows if r["type"] == "validation")
assert w["samples"] == 16, w["samples"]
head = (2 * 4 * 768 * 2 + 2) * 4  # the head's gradient, nothing of the backbone
assert 0 < w["allreduce_bytes"] - head < 1024, w["allreduce_bytes"]  # + the window's totals
assert 0 < w["mem_peak_backbone"] < w["mem_peak_context"] <= w["mem_peak"], w
assert len(v["val_cases"]) == 4 and 0 <= v["val_dice"] <= 1, v
print(f"dino-context-v100.yaml: one window of 16, all-reduced {w['allreduce_bytes']} B "
      f"(the head's gradient {head} B), "
      f"peaks backbone {w['mem_peak_backbone']} context {w['mem_peak_context']} "
      f"window {w['mem_peak']}; val_dice {v['val_dice']:.3f} over 4 cases")
EOF

volume_config unet3d-v100.yaml unet 32 8 9
volume_config swin-unetr-v100.yaml swin 64 12 18
echo "PASS"
