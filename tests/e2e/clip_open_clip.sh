#!/usr/bin/env bash
# model.name=clip against open_clip itself (issue 32; Note [CLIP as
# open_clip]):
# 1. open_clip 3.3.0 builds CLIP with random weights (every parameter
#    perturbed, layer norms and biases too: tests/peers/clip_reference.py)
#    for tiny (32 px), tiny-quickgelu (48 px), ViT-B-32 and ViT-B-16
#    (224 px); its state dict (torch.save .pt or safetensors) loads into
#    memtrain strictly, and `memtrain embed` gives open_clip's
#    logits_per_image and unit features within 1e-4 (relative, fp32) on
#    images and captions open_clip tokenized.
# 2. Exact contrastive accumulation on CLIP: one window of 48 pairs from
#    open_clip's weights (model.pretrained), split as 1x1x48, 1x6x8, 2x3x8
#    and 4x2x6 (ranks x micro-steps x micro-batch), gives the same loss and
#    weights within 1e-5, equal to open_clip's own ClipLoss of the one batch
#    and its SGD step in float64; model.safetensors has open_clip's names,
#    shapes and order.
# 3. Refusals: another variant, a /features_b pair file, images of another
#    size than the patch grid allows.
# Python: the torch venv (torch 2.11, open_clip: launch/install_peers.sh).
source "$(dirname "$0")/common.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
OPY=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
"$OPY" -c 'import open_clip, h5py, numpy, torch, safetensors' >/dev/null 2>&1 ||
  fail "no open_clip in $OPY: run bash launch/install_peers.sh (it installs open_clip into the torch venv)"
REF=("$OPY" "$PEER_SCRIPTS/clip_reference.py")

compare() {  # DIR VARIANT SIZE N SEED FORMAT
  local d=$1
  mkdir -p "$d"
  "${REF[@]}" make "$@" || fail "$d: open_clip side"
  "$MEMTRAIN" embed --weights "$d/open_clip.$6" --data "$d/pairs.h5" --out "$d/emb.h5" \
    --model.name=clip --model.variant="$2" >"$d/embed.log" 2>&1 || { cat "$d/embed.log"; fail "$d: embed"; }
  "${REF[@]}" compare "$d" || fail "$d: memtrain's clip is not open_clip's"
}
compare tiny tiny 32 6 3 pt
compare quick tiny-quickgelu 48 5 4 safetensors
compare b32 ViT-B-32 224 3 5 pt
compare b16 ViT-B-16 224 2 6 safetensors

# 2. The exact window, from open_clip's weights.
mkdir -p win
"${REF[@]}" make win tiny 32 48 7 pt || fail "win: open_clip side"
common=(--model.name=clip --model.variant=tiny --model.pretrained=win/open_clip.pt
  --data.train=win/pairs.h5 --data.val= --training.effective_batch_size=48
  --training.max_windows=1 --training.lr=0.1 --output.save_initial=true)
window() { "$PY" -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if "\"window\"" in l][0]
print(r[sys.argv[2]])' "$1/metrics.jsonl" "$2"; }
close() { "$PY" -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t else 1)" "$@"; }
run() {  # NAME NP MICRO
  mpi -np "$2" "$MEMTRAIN" train "${common[@]}" --data.batch_size="$3" \
    --output.dir="$1" >"$1.log" 2>&1 || { cat "$1.log"; fail "$1"; }
}
run 1x1x48 1 48
run 1x6x8 1 8
run 2x3x8 2 8
run 4x2x6 4 6
"${REF[@]}" order win 1x1x48/model.safetensors || fail "model.safetensors is not in open_clip's layout"
ref=$(window 1x1x48 loss)
for split in 1x6x8 2x3x8 4x2x6; do
  l=$(window $split loss)
  d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" 1x1x48/model.safetensors $split/model.safetensors)
  echo "clip exact $split: loss $l (1x1x48: $ref), max |w - w(1x1x48)| = $d"
  close "$l" "$ref" 1e-5 && close "$d" 0 1e-5 || fail "$split changed the exact update"
done
out=$("${REF[@]}" step win tiny 32 win/pairs.h5 1x1x48/initial.safetensors 0.1 1x1x48/model.safetensors) ||
  fail "float64 reference"
r=$(echo "$out" | sed -n 1p)
w=$(echo "$out" | sed -n 2p)
echo "open_clip ClipLoss (float64): $r (memtrain $ref), max |w - reference| = $w"
close "$ref" "$r" 1e-5 && close "$w" 0 1e-5 || fail "memtrain's window differs from open_clip's float64 step"

# 3. Refusals, exit 2, named.
expect_error() {  # PATTERN command...
  local pattern=$1 rc=0
  shift
  "$@" >err.log 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q -- "$pattern" err.log || { cat err.log; fail "expected exit 2 and '$pattern' (exit $rc)"; }
}
expect_error "model.variant='ViT-L-14' is not a CLIP memtrain builds" \
  "$MEMTRAIN" train "${common[@]}" --model.variant=ViT-L-14 --output.dir=bad
"$MEMTRAIN" make-data --kind pairs --samples 8 --features 4 --context 4 --out feat.h5 >/dev/null
expect_error "model.name=clip needs a pair file of /images and /tokens" \
  "$MEMTRAIN" train "${common[@]}" --model.pretrained= --data.train=feat.h5 --output.dir=bad
expect_error "a multiple of the patch size 32" \
  "$MEMTRAIN" train "${common[@]}" --model.pretrained= --model.variant=ViT-B-32 --data.train=quick/pairs.h5 --output.dir=bad
echo "clip_open_clip: ok"
