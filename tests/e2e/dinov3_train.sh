#!/usr/bin/env bash
# model.name=dinov3 trains its head on the slices of volumes (issue 54,
# point 4; nets/dinov3_seg.h), with the tiny DINOv3 (4 blocks of 64):
# 1. Its backbone from timm's own file (model.pretrained, timm's names with
#    q/v biases: tests/peers/dinov3_reference.py) at 2 ranks: the load is
#    reported as timm's, the loss falls, validation gives per-volume Dice;
#    model.safetensors' backbone is the file's (converted), bit for bit,
#    and only its head moved from initial.safetensors. Meta's file, and
#    the run's own model.safetensors (backbone and head) load too.
# 2. model.slice_chunk=3 trains the window losses of all slices at once
#    (within 1e-6: the matrix products see other batch sizes), and slicing
#    across W (slice_axis 2) trains too; each window all-reduces exactly
#    the head's gradient and the window's totals: 5 classes send exactly
#    the 4 x 64 x 2 + 2 floats of their larger head more than 3.
# 3. model.slice_chunk auto under memory.budget: the planner's chunk.
# 4. Refusals, exit 2, one line: a DINOv3 size memtrain lacks, slices not
#    of whole 16-pixel patches, a file of another size (named by its first
#    shape that differs and the size it looks like), a NaN bias_mask.
# Python: the torch venv (torch 2.11, timm: launch/install_peers.sh).
source "$(dirname "$0")/common.sh"
OPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
"$OPY" -c 'import timm, safetensors, torch' >/dev/null 2>&1 ||
  fail "no timm in $OPY: run bash launch/install_peers.sh (it installs timm into the torch venv)"
REF=("$OPY" "$PEER_SCRIPTS/dinov3_reference.py")

for split in train val; do
  "$MEMTRAIN" make-data --kind volumes --out $split.h5 --samples 4 --channels 1 \
    --depth 16 --height 32 --width 32 --classes 3 --noise 0.5 --split $split \
    --chunk 4 >/dev/null || fail "make-data $split"
done
mkdir -p tiny small
"${REF[@]}" make tiny tiny 7 || fail "timm side (tiny)"
common=(--data.train=train.h5 --data.val=val.h5 --model.name=dinov3 --model.variant=tiny
  --data.patch_size=[4,32,32] --data.batch_size=2 --training.effective_batch_size=4
  --data.patches_per_volume=2 --training.optimizer=adamw --training.lr=0.01
  --validation.every_epochs=3)

# 1. timm's file, 2 ranks.
train_common 2 timm --model.pretrained=tiny/timm.pth --training.epochs=6 --output.save_initial=true
grep -q "timm's DINOv3 names (q and v biases" timm.log || { cat timm.log; fail "the load is not reported as timm's"; }
"$OPY" - timm tiny/timm.pth <<'EOF' || fail "timm: see above"
import json, sys, torch, safetensors.torch as st
out, src = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
wins = [r for r in rows if r["type"] == "window"]
vals = [r for r in rows if r["type"] == "validation"]
assert len({w["allreduce_bytes"] for w in wins}) == 1 and all(w["allreduce_calls"] == 1 for w in wins)
first, last = wins[0]["loss"], wins[-1]["loss"]
assert last < 0.8 * first, f"the loss did not fall: {first} -> {last}"
assert vals and all("val_dice" in v for v in vals), vals
fin, ini = st.load_file(f"{out}/model.safetensors"), st.load_file(f"{out}/initial.safetensors")
timm = torch.load(src)
assert torch.equal(fin["backbone.cls_token"], timm["cls_token"])
assert torch.equal(fin["backbone.storage_tokens"], timm["reg_token"])
assert torch.equal(fin["backbone.blocks.2.ls1.gamma"], timm["blocks.2.gamma_1"])
q = fin["backbone.blocks.1.attn.qkv.bias"]
assert torch.equal(q[:64], timm["blocks.1.attn.q_bias"]) and torch.equal(q[128:], timm["blocks.1.attn.v_bias"])
moved = [k for k in fin if not torch.equal(fin[k], ini[k])]
assert moved and all(k.startswith("head.") for k in moved), moved
print(f"timm: {len(wins)} windows, loss {first:.4f} -> {last:.4f}, {wins[0]['allreduce_bytes']} bytes "
      f"all-reduced a window, val_dice {vals[-1]['val_dice']:.3f}; moved: {moved}")
EOF

# 2. Chunks of slices, and slices across W.
train_common 1 all --training.max_windows=3 --data.prefetch=0
train_common 1 chunk --training.max_windows=3 --data.prefetch=0 --model.slice_chunk=3
"$PY" - <<'EOF' || fail "slice_chunk=3 trains other losses than all slices at once"
import json
def losses(d):
    return [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"window"' in l]
a, b = losses("all"), losses("chunk")
assert len(a) == 3 and all(abs(x - y) <= 1e-6 * abs(x) for x, y in zip(a, b)), (a, b)
EOF
train_common 2 across_w --training.max_windows=2 --model.slice_axis=2 --data.patch_size=[16,32,4] \
  --model.num_classes=5
# The all-reduce is the head's gradient and the window's totals, nothing
# of the backbone: 5 classes all-reduce exactly the 4 x 64 x 2 + 2 more
# floats of their head, and what is not the head's gradient is the same
# few hundred bytes (WindowTotals at 2 ranks) in both runs.
"$PY" - <<'EOF' || fail "the all-reduce is not the head's gradient"
import json
def sent(d):
    return {json.loads(l)["allreduce_bytes"] for l in open(f"{d}/metrics.jsonl") if '"window"' in l}
a, b = sent("timm"), sent("across_w")
assert len(a) == len(b) == 1, (a, b)
a, b = a.pop(), b.pop()
head3, head5 = 4 * 64 * 3 + 3, 4 * 64 * 5 + 5
assert b - a == 4 * (head5 - head3), (a, b)
rest = a - 4 * head3
assert rest == b - 4 * head5 and 0 < rest < 1024, rest
print(f"all-reduced a window: {a} bytes (head 3 classes: {4 * head3}), {b} bytes "
      f"(5 classes: {4 * head5}); the rest {rest} bytes")
EOF

# Meta's file, and memtrain's own whole model (backbone and head), as
# model.pretrained.
train_common 1 meta --training.max_windows=1 --model.pretrained=tiny/meta.pth
grep -q "Meta's DINOv3 names" meta.log || { cat meta.log; fail "meta.pth not read as Meta's"; }
grep -q "mask_token dropped" meta.log || { cat meta.log; fail "meta.pth: mask_token not reported dropped"; }
train_common 1 whole --training.max_windows=1 --model.pretrained=timm/model.safetensors \
  --output.save_initial=true
grep -q "69 of 69 tensors loaded" whole.log || { cat whole.log; fail "the whole model did not load by name"; }
"$OPY" - <<'EOF' || fail "the whole model's head was not loaded"
import torch, safetensors.torch as st
a, b = st.load_file("timm/model.safetensors"), st.load_file("whole/initial.safetensors")
assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
EOF

# 3. model.slice_chunk auto under memory.budget (Note [Planning the
# extraction chunk]): vits16 (random weights: its extraction, not the
# head, is the peak), micro-batches of 2 x 16 slices of 32x32. With 1 GiB
# all 32 slices go in one call; with 104,500,000 bytes (usable 94,050,000)
# fewer: the chosen chunk's probe fits and the next one's failed, the
# windows' peaks stay within the usable budget, and the losses are the
# one-call run's within 1e-6.
dino_s=(--model.variant=vits16 --model.pretrained= --data.patch_size=[16,32,32]
  --training.max_windows=2 --validation.every_epochs=100 --data.prefetch=0)
train_common 1 roomy "${dino_s[@]}" --memory.budget=1GiB
train_common 1 tight "${dino_s[@]}" --memory.budget=104500000
grep -q "model.slice_chunk auto: [0-9]* of the micro-batch's 32 slices a backbone call" tight.log ||
  { cat tight.log; fail "tight: the chunk is not in the plan's line"; }
"$PY" - <<'EOF' || fail "model.slice_chunk auto: see above"
import json
def run(d):
    plan = json.load(open(f"{d}/memory_plan.json"))
    wins = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"window"' in l]
    return plan, wins
(rp, rw), (tp, tw) = run("roomy"), run("tight")
assert rp["extraction_units"] == tp["extraction_units"] == 32, (rp, tp)
assert rp["extraction_chunk"] == 32, rp["extraction_chunk"]
chunk = tp["extraction_chunk"]
assert 1 < chunk < 32, chunk
probes = {q["extraction_chunk"]: q for q in tp["probes"] if q["extraction_chunk"] > 0}
assert probes[chunk]["fits"] and not probes[chunk + 1]["fits"], probes
usable = tp["usable_bytes"]
assert probes[chunk]["peak_bytes"] <= usable and all(w["mem_peak"] <= usable for w in tw), (usable, tw)
assert len(rw) == len(tw) == 2
assert all(abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]) for a, b in zip(rw, tw)), (rw, tw)
print(f"slice_chunk auto: {chunk} of 32 slices a call under {usable} usable bytes "
      f"(window peaks {[w['mem_peak'] for w in tw]}); 32 with 1 GiB")
EOF

# 4. Refusals.
refused_common size "'vitl16' is not a DINOv3 size memtrain has" --model.variant=vitl16
refused_common patches "must be multiples of 16" --data.patch_size=[4,24,32]
refused_common other "cls_token [1, 1, 64] in the file, [1, 1, 384] in vits16 - this looks like tiny" \
  --model.variant=vits16 --model.pretrained=tiny/meta.pth
refused_common nan "blocks.1.attn.qkv.bias_mask holds NaN" --model.pretrained=tiny/meta_nan_mask.pth
echo "dinov3_train: passed"
