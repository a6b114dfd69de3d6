#!/usr/bin/env bash
# model.name=swin_unetr against MONAI's SwinUNETR itself (issue 31):
# 1. MONAI 1.6.1 builds SwinUNETR with fixed, perturbed weights
#    (tests/peers/swin_unetr_reference.py); memtrain's model loads MONAI's
#    state dict by name, strict (tests/tools/forward_logits), has exactly
#    its tensor names, shapes and order, and gives its logits within 1e-4
#    (relative, fp32): 2 channels, feature size 12, a 64x32x96 input
#    (windows cut to the feature map on some axes and not others, mixed
#    shifts), read from the torch.save file MONAI's state_dict() makes
#    (monai.pt); 1 channel, feature size 24, 32x32x64, from safetensors.
# 2. 2 ranks train swin_unetr (feature size 12, 32x32x64 patches, every
#    segment checkpointed) and validate by sliding window; a patch size
#    that is not a multiple of 32, or 32^3 (one voxel at 1/32, where
#    MONAI's instance norm refuses to run), is refused at start-up.
# 3. Self-supervised encoder weights laid out as MONAI's model_swinvit.pt
#    load through model.pretrained with model.pretrained_strict=false and
#    two model.pretrained_rename rules: the swinViT.* tensors take the
#    values MONAI's own SwinUNETR.load_from gives them (and keep them,
#    frozen by model.freeze), and the report names what was not loaded.
# Python: the torch venv (torch 2.11, MONAI, einops:
# launch/install_peers.sh).
source "$(dirname "$0")/common.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
MPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
FWD=$(dirname "$MEMTRAIN")/tests/forward_logits
"$MPY" -c 'import monai, einops, numpy, torch' >/dev/null 2>&1 ||
  fail "no MONAI in $MPY: run bash launch/install_peers.sh (it installs MONAI into the torch venv)"
[ -x "$FWD" ] || fail "no $FWD (cmake --build build --target forward_logits)"

compare() {  # NAME FORMAT IN CLASSES FEATURE D H W SEED
  local d=$1
  mkdir -p "$d"
  "$MPY" "$PEER_SCRIPTS/swin_unetr_reference.py" make "$d" "${@:3}" || fail "$d: MONAI side"
  "$FWD" --weights "$d/monai.$2" --input "$d/x.safetensors" \
    --out "$d/memtrain_logits.safetensors" --names "$d/memtrain_names.txt" \
    --classes "$4" model.name=swin_unetr model.feature_size="$5" || fail "$d: memtrain side"
  "$MPY" "$PEER_SCRIPTS/swin_unetr_reference.py" compare "$d" || fail "$d: memtrain's swin_unetr is not MONAI's"
}
compare ragged pt 2 3 12 64 32 96 7
compare small safetensors 1 2 24 32 32 64 11

# 2. Training and validation, 2 ranks.
"$MEMTRAIN" make-data --kind volumes --out train.h5 --samples 4 --channels 1 \
  --depth 32 --height 32 --width 64 --classes 3 --noise 0.7 --split train >/dev/null || fail "make-data"
"$MEMTRAIN" make-data --kind volumes --out val.h5 --samples 2 --channels 1 \
  --depth 32 --height 32 --width 64 --classes 3 --noise 0.7 --split val >/dev/null || fail "make-data"
SWIN=(--model.name=swin_unetr --model.feature_size=12 --data.train=train.h5 --data.val=val.h5
      --data.patch_size=[32,32,64] --data.batch_size=2 --data.patches_per_volume=2)
timeout 600 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train "${SWIN[@]}" \
  --training.epochs=1 --training.gradient_checkpointing=all --output.dir=run >train.log 2>&1 ||
  { tail -30 train.log; fail "train"; }
"$PY" - <<'PYEOF' || fail "swin_unetr's records"
import json, math
recs = [json.loads(l) for l in open("run/metrics.jsonl")]
win = [r for r in recs if r.get("type") == "window"]
val = [r for r in recs if r.get("type") == "validation"]
assert win and all(math.isfinite(r["loss"]) for r in win), win
assert len(val) == 1 and 0 <= val[0]["val_dice"] <= 1, val
assert [c["case"] for c in val[0]["val_cases"]] == ["0", "1"], val[0]["val_cases"]
print(f"swin_unetr: {len(win)} windows, loss {win[0]['loss']:.4f} -> {win[-1]['loss']:.4f}, val_dice {val[0]['val_dice']:.4f}")
PYEOF
grep -q "layers1" run/memory_plan.json || fail "memory_plan.json names no swin_unetr segment"
# A patch that is not a multiple of 32: refused before training, exit 2.
rc=0
"$MEMTRAIN" train "${SWIN[@]}" --data.patch_size=16 --output.dir=bad >bad.log 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat bad.log; fail "patch 16: exit $rc, want 2"; }
grep -q "must be multiples of 32 on every axis: swin_unetr halves them 5 times" bad.log ||
  { cat bad.log; fail "patch 16: no message naming the rule"; }
rc=0
"$MEMTRAIN" train "${SWIN[@]}" --data.patch_size=32 --output.dir=bad >bad32.log 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat bad32.log; fail "patch 32^3: exit $rc, want 2"; }
grep -q "one voxel at 1/32" bad32.log || { cat bad32.log; fail "patch 32^3: no message"; }

# 3. model_swinvit.pt's layout through model.pretrained, 1 rank, the
#    encoder frozen.
mkdir -p ssl
"$MPY" "$PEER_SCRIPTS/swin_unetr_reference.py" ssl ssl 1 3 12 5 || fail "ssl: MONAI side"
timeout 600 "$MEMTRAIN" train "${SWIN[@]}" --training.epochs=1 --model.freeze=[swinViT] \
  --output.save_initial=true --model.pretrained=ssl/model_swinvit.pt \
  --model.pretrained_strict=false \
  "--model.pretrained_rename=['^module\\. -> swinViT.', '\\.mlp\\.fc([12])\\. -> .mlp.linear\$1.']" \
  --output.dir=ssl_run >ssl.log 2>&1 || { tail -30 ssl.log; fail "ssl train"; }
grep -q "model.pretrained: ssl/model_swinvit.pt ('state_dict'): " ssl.log ||
  { cat ssl.log; fail "ssl: no load report"; }
"$MPY" "$PEER_SCRIPTS/swin_unetr_reference.py" check-ssl ssl ssl_run || fail "ssl: not loaded as MONAI's load_from loads it"
echo "PASS swin_unetr_monai"
