#!/usr/bin/env bash
# memtrain's DINOv3 ViT against timm's (issue 54, point 3; Note [DINOv3 as
# Meta's]): timm 1.0.31 builds vit_small_patch16_dinov3_qkvb with random
# weights, every tensor perturbed (tests/peers/dinov3_reference.py), and
# saves it with torch.save in Meta's names (timm's own converter gives the
# timm file back from it exactly) and in timm's (.pth and .safetensors),
# and the model without q/v biases. memtrain loads each strictly through
# its one table of names (tests/tools/dinov3_features) and its patch
# features of layers [2, 5, 8, 11] (final norm, prefix tokens stripped,
# B x D x h x w) and class tokens equal timm's forward_intermediates
# within 1e-5 of the largest value, at 224x224 and at 256x320 (RoPE on
# another grid). Meta's periods stored in bfloat16 load as stored: the
# features then equal timm's with those periods, and differ from the
# float32 ones by more than the tolerance. A NaN bias_mask is refused,
# named, exit 2.
# Python: the torch venv (torch 2.11, timm: launch/install_peers.sh).
source "$(dirname "$0")/common.sh"
OPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
"$OPY" -c 'import timm, safetensors, torch' >/dev/null 2>&1 ||
  fail "no timm in $OPY: run bash launch/install_peers.sh (it installs timm into the torch venv)"
REF=("$OPY" "$PEER_SCRIPTS/dinov3_reference.py")
FEAT=$(dirname "$MEMTRAIN")/tests/dinov3_features
[ -x "$FEAT" ] || fail "no $FEAT (cmake --build build --target dinov3_features)"

mkdir -p s
"${REF[@]}" make s vits16 5 || fail "timm side"
features() {  # WEIGHTS OUT
  "$FEAT" --variant vits16 --weights "s/$1" --input s/inputs.safetensors \
    --out "s/$2" >"s/$2.log" 2>&1 || { cat "s/$2.log"; fail "$1: memtrain did not load it"; }
  grep -q "tensors loaded" "s/$2.log" || { cat "s/$2.log"; fail "$1: no load report"; }
}
features meta.pth got_meta.safetensors
features timm.pth got_timm.safetensors
features timm.safetensors got_timm_st.safetensors
features timm_noqkvb.pth got_noqkvb.safetensors
features meta_bf16.pth got_bf16.safetensors
grep -q "Meta's DINOv3 names" s/got_meta.safetensors.log || fail "meta.pth not read as Meta's"
grep -q "q and v biases" s/got_timm.safetensors.log || fail "timm.pth not read as timm's _qkvb"
grep -q "no qkv bias" s/got_noqkvb.safetensors.log || fail "timm_noqkvb.pth not read as timm's"

for got in got_meta got_timm got_timm_st; do
  "${REF[@]}" compare "s/$got.safetensors" s/expected.safetensors ||
    fail "$got: memtrain's features are not timm's"
done
"${REF[@]}" compare s/got_noqkvb.safetensors s/expected_noqkvb.safetensors ||
  fail "timm without q/v biases: memtrain's features are not timm's"
"${REF[@]}" compare s/got_bf16.safetensors s/expected_bf16.safetensors ||
  fail "bfloat16 periods: memtrain's features are not timm's with those periods"
"${REF[@]}" differ s/got_bf16.safetensors s/expected.safetensors ||
  fail "the bfloat16 periods made no difference: were they loaded as stored?"

# A NaN bias_mask (Meta's module before init_weights): refused, named.
rc=0
"$FEAT" --variant vits16 --weights s/meta_nan_mask.pth --input s/inputs.safetensors \
  --out s/nan.safetensors >s/nan.log 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "a NaN bias_mask: exit $rc, not 2"
grep -q "blocks.1.attn.qkv.bias_mask holds NaN" s/nan.log || { cat s/nan.log; fail "the NaN mask is not named"; }
[ ! -e s/nan.safetensors ] || fail "features were written from a refused file"
echo "dinov3_timm: passed"
