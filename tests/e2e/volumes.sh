#!/usr/bin/env bash
# 3D volumes through the executable (synthetic make-data files, unet3d):
# 1. 2 ranks train and validate by sliding window: one "validation" record
#    per validation (after epochs 2, 4 and 5 with every_epochs=2), all its
#    fields, Dice that rises above a threshold; data_wait_s in every window.
# 2. validation.offload=cpu: val_device_peak is the same for 32^3 and 64^3
#    volumes; offload=device: it grows by the (K+1) float32 sums per voxel.
# 3. The patch prefetcher (prefetch 4, 3 reader threads) trains bit for bit
#    like reading in place (prefetch 0): window losses and model.safetensors.
# 4. Bad inputs end with exit status 2 and one error line naming the file
#    (and the dataset) or the key, at 1 and 2 ranks; a contiguous file and
#    chunks larger than the patch train with one warning (rank 0 only).
# 5. memtrain inspect on a volume file.
# 6. Ragged files (cases of different shapes, make-data --ragged): 2 ranks
#    train on 24^3 patches (cases smaller than that are padded) and
#    validate; inspect lists the cases; `memtrain eval` of the 2-case
#    ragged file = the mean of eval on each case alone in a file of its
#    own shape (h5py crops it): the padding is never read or scored.
source "$(dirname "$0")/common.sh"
K=3  # classes of every synthetic file here

mkvol() {  # OUT SAMPLES EDGE SPLIT [MAKE-DATA ARGS...]
  local out=$1 n=$2 e=$3 split=$4
  shift 4
  "$MEMTRAIN" make-data --kind volumes --out "$out" --samples "$n" --channels 1 \
    --depth "$e" --height "$e" --width "$e" --classes $K --noise 0.7 --split "$split" \
    "$@" >/dev/null || fail "make-data $out"
}
UNET=(--model.name=unet3d --model.feature_size=8 --model.depth=3 --model.norm=instance
      --data.patch_size=16 --training.optimizer=adamw --training.lr=0.003)
train() {  # NP NAME ARGS...: a run that must succeed; NAME.log, NAME/
  local np=$1 name=$2
  shift 2
  local start=$SECONDS rc=0
  timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$MEMTRAIN" train "${UNET[@]}" \
    --output.dir="$name" "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { tail -30 "$name.log"; fail "$name: exit status $rc"; }
  echo "$name: np=$np, $((SECONDS - start)) s"
}

mkvol train.h5 4 32 train --chunk 16
mkvol val.h5 2 32 val --chunk 16
mkvol val64.h5 2 64 val --chunk 16

# 1. Training and validation records, 2 ranks.
train 2 fit --data.train=train.h5 --data.val=val.h5 --data.batch_size=4 \
  --data.patches_per_volume=16 --training.epochs=5 --validation.every_epochs=2
"$PY" - $K <<'PYEOF' || fail "validation records of fit/metrics.jsonl"
import json, math, sys
k = int(sys.argv[1])
recs = [json.loads(l) for l in open("fit/metrics.jsonl")]
val = [r for r in recs if r.get("type") == "validation"]
win = [r for r in recs if r.get("type") == "window"]
epochs = [r["epoch"] + 1 for r in val]
print(f"validations after epochs {epochs}")
assert epochs == [2, 4, 5], f"want validations after epochs [2, 4, 5], got {epochs}"
for r in val:
    missing = {"val_dice", "val_dice_per_class", "val_loss", "val_device_peak",
               "val_seconds", "val_offload"} - r.keys()
    assert not missing, f"epoch {r['epoch'] + 1}: missing {sorted(missing)}"
    per = r["val_dice_per_class"]
    print(f"  epoch {r['epoch'] + 1}: val_dice {r['val_dice']:.4f} per class "
          f"{[round(d, 4) for d in per]} val_loss {r['val_loss']:.4f} "
          f"val_device_peak {r['val_device_peak']} B val_seconds {r['val_seconds']:.3f}")
    assert len(per) == k, f"val_dice_per_class has {len(per)} entries, want {k}"
    assert all(d is not None and 0 <= d <= 1 for d in per), per
    assert 0 <= r["val_dice"] <= 1, r["val_dice"]
    assert math.isfinite(r["val_loss"]) and r["val_loss"] > 0, r["val_loss"]
    assert r["val_device_peak"] > 0, r["val_device_peak"]
    assert r["val_seconds"] > 0, r["val_seconds"]
    assert r["val_offload"] == "cpu", r["val_offload"]
first, last = val[0]["val_dice"], val[-1]["val_dice"]
# Measured 0.680 -> 0.777 -> 0.813 on the reference machine.
assert last > 0.6, f"last val_dice {last:.4f} <= 0.6: the model did not learn"
assert last > first, f"val_dice did not rise: {first:.4f} -> {last:.4f}"
waits = [r.get("data_wait_s") for r in win]
assert win and all(w is not None and w >= 0 for w in waits), waits
print(f"{len(win)} windows, data_wait_s in [{min(waits):.2e}, {max(waits):.2e}] s")
PYEOF
! grep -qE "contiguous|larger than the patch" fit.log || fail "fit: layout warning for a well-chunked file"

# 2. Validation's device peak vs the volume size. overlap 0 gives 8 and 64
#    windows: full batches of sw_batch=4 in both (see the report: a partial
#    last batch of 1 window costs more than a full one on the CPU build).
for e in 32 64; do
  f=val.h5
  [ $e = 64 ] && f=val64.h5
  for o in cpu device; do
    train 2 peak_${o}_$e --data.train=train.h5 --data.val=$f --data.batch_size=4 \
      --data.patches_per_volume=2 --training.epochs=1 --validation.offload=$o \
      --validation.sw_batch=4
  done
done
"$PY" - $K <<'PYEOF' || fail "validation device peaks"
import json, sys
k = int(sys.argv[1])
def peak(d):
    v = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"validation"' in l]
    assert len(v) == 1 and v[0]["val_volumes"] == 2, (d, v)
    return v[0]["val_device_peak"]
c32, c64 = peak("peak_cpu_32"), peak("peak_cpu_64")
d32, d64 = peak("peak_device_32"), peak("peak_device_64")
want = 0.9 * (k + 1) * 4 * (64**3 - 32**3)
print(f"val_device_peak offload=cpu: 32^3 {c32} B, 64^3 {c64} B; "
      f"offload=device: 32^3 {d32} B, 64^3 {d64} B (grows {d64 - d32} B, want >= {want:.0f})")
assert c32 == c64, f"offload=cpu: the device peak grew with the volume: {c32} -> {c64}"
assert d64 - d32 >= want, f"offload=device: grew only {d64 - d32} B, want >= {want:.0f}"
PYEOF

# 3. The prefetcher does not change what is trained.
PF=(--data.train=train.h5 --data.val= --data.batch_size=2 --data.patches_per_volume=8
    --data.flip=all --training.epochs=2)
train 2 pf0 "${PF[@]}" --data.prefetch=0
train 2 pf4 "${PF[@]}" --data.prefetch=4 --data.read_threads=3
"$PY" - <<'PYEOF' || fail "prefetch 0 and 4 trained differently"
import json
def losses(d):
    return [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"window"' in l]
a, b = losses("pf0"), losses("pf4")
print(f"window losses: {len(a)} (prefetch 0) vs {len(b)} (prefetch 4), "
      f"identical: {a == b}; first {a[0]!r}, last {a[-1]!r}")
assert a and a == b
PYEOF
cmp pf0/model.safetensors pf4/model.safetensors || fail "model.safetensors differ (prefetch 0 vs 4)"
echo "model.safetensors identical: $(md5sum <pf0/model.safetensors | cut -c1-32)"

# 4. Bad inputs.
"$MEMTRAIN" make-data --kind features --out features.h5 --samples 64 >/dev/null
for c in mask-shape mask-range; do
  "$MAKE_BAD_H5" "$c" "$c.h5"
done
expect_error() {  # NP PATTERN ARGS...: fixed-string PATTERN in the error line
  local np=$1 pattern=$2
  shift 2
  local start=$SECONDS rc=0
  timeout 120 "$MPIEXEC" --oversubscribe -np "$np" "$MEMTRAIN" train "${UNET[@]}" \
    --data.val= --training.epochs=1 --output.dir=out "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" = 2 ] || { cat out.txt err.txt; fail "np=$np $*: exit $rc, want 2"; }
  local n
  n=$(grep -c "^memtrain: error:" err.txt || true)
  [ "$n" = 1 ] || { cat err.txt; fail "np=$np $*: $n error lines, want 1"; }
  grep "^memtrain: error:" err.txt | grep -qF -- "$pattern" ||
    { cat err.txt; fail "np=$np $*: the error line lacks '$pattern'"; }
  ! grep -q "window" out.txt || fail "np=$np $*: training started"
  echo "np=$np $((SECONDS - start))s: $(grep '^memtrain: error:' err.txt)"
}
for np in 1 2; do
  expect_error $np "data.patch_size=[64, 64, 64] is larger than the volumes of 'train.h5'" \
    --data.train=train.h5 --data.patch_size=64
  expect_error $np "'mask-shape.h5' dataset '/masks': shape [2,8,8,4] does not match" \
    --data.train=mask-shape.h5 --data.patch_size=8
  expect_error $np "'mask-range.h5' dataset '/masks': label 5" \
    --data.train=mask-range.h5 --data.patch_size=8
  # Names the key (data.train), not the file; see the report.
  expect_error $np "model.name=unet3d cannot train on features (data.train 'features.h5')" --data.train=features.h5
  # model.norm=none: instance norm is unet3d's (the config refuses it
  # for mlp before any file is opened).
  expect_error $np "model.name=mlp cannot train on volumes (data.train 'train.h5'" \
    --data.train=train.h5 --model.name=mlp --model.norm=none
  expect_error $np "model.norm=instance is unet3d's and swin_unetr's; model.name=mlp" \
    --data.train=train.h5 --model.name=mlp
  expect_error $np "data.patch_size=[18, 18, 18]" --data.train=train.h5 --data.patch_size=18
done
grep "^memtrain: error:" err.txt | grep -qF "multiples of 4" || fail "patch 18: no 'multiples of 4'"

# Layout warnings: once (rank 0), training goes on.
"$MAKE_BAD_H5" contiguous-volumes contig.h5  # make-data always chunks (checksums)
mkvol chunk32.h5 4 32 train --chunk 32
expect_warning() {  # NAME PATTERN... (NAME.log from train)
  local name=$1 p n
  shift
  for p in "$@"; do
    n=$(grep -cF -- "$p" "$name.log" || true)
    [ "$n" = 1 ] || { cat "$name.log"; fail "$name: $n lines with '$p', want 1"; }
  done
  echo "$name: $(grep -F -- "$1" "$name.log" | cut -c1-150)..."
}
LAYOUT=(--data.val= --data.batch_size=4 --data.patches_per_volume=2 --training.epochs=1)
train 2 contig --data.train=contig.h5 "${LAYOUT[@]}"
expect_warning contig "contiguous" "h5repack"
train 2 chunk32 --data.train=chunk32.h5 "${LAYOUT[@]}"
expect_warning chunk32 "larger than the patch" "h5repack"

# 5. inspect.
"$MEMTRAIN" inspect train.h5 >inspect.txt 2>&1 || { cat inspect.txt; fail "inspect train.h5"; }
grep -q "^layout: volumes" inspect.txt || { cat inspect.txt; fail "inspect: no 'layout: volumes'"; }
grep -q "^problems: none" inspect.txt || { cat inspect.txt; fail "inspect: no 'problems: none'"; }
echo "inspect: $(grep '^layout:' inspect.txt); $(grep '^problems:' inspect.txt)"
rc=0
"$MEMTRAIN" inspect mask-range.h5 >inspect.txt 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -qF "dataset '/masks': label 5" inspect.txt ||
  { cat inspect.txt; fail "inspect mask-range.h5: exit $rc"; }
echo "inspect mask-range.h5: exit $rc, $(grep -F "label 5" inspect.txt | cut -c1-100)"

# 6. Ragged files.
mkvol rtrain.h5 6 32 train --chunk 16 --ragged
mkvol rval.h5 2 32 val --chunk 16 --ragged
"$MEMTRAIN" inspect rtrain.h5 >rinspect.txt 2>&1 || { cat rinspect.txt; fail "inspect rtrain.h5"; }
grep "^cases of different shapes: 6, from" rinspect.txt || { cat rinspect.txt; fail "inspect: no cases"; }
RAG=(--data.train=rtrain.h5 --data.val=rval.h5 --data.batch_size=2 --data.patch_size=24
     --data.patches_per_volume=2 --training.epochs=2 --validation.every_epochs=1)
train 2 ragged "${RAG[@]}"
grep -q "volume(s) up to \[1,32,32,32\]" ragged.log || { grep -i "volume(s)" ragged.log; fail "ragged: no 'up to'"; }
/usr/bin/python3 - rval.h5 <<'PYEOF' || fail "crop rval.h5 (python3-h5py: bash launch/install_deps.sh)"
import h5py, sys
with h5py.File(sys.argv[1]) as f:
    for v, (d, h, w) in enumerate(f["volume_shapes"][:]):
        with h5py.File(f"rcase{v}.h5", "w") as g:
            g.create_dataset("volumes", data=f["volumes"][v:v + 1, :, :d, :h, :w],
                             chunks=(1, 1, min(16, d), min(16, h), min(16, w)), fletcher32=True)
            g.create_dataset("masks", data=f["masks"][v:v + 1, :d, :h, :w],
                             chunks=(1, min(16, d), min(16, h), min(16, w)), fletcher32=True)
            g.attrs["num_classes"] = f.attrs["num_classes"]
        print(f"case {v}: {d}x{h}x{w}")
PYEOF
for f in rval rcase0 rcase1; do
  mpi -np 1 "$MEMTRAIN" eval "${UNET[@]}" "${RAG[@]}" --data.val=$f.h5 --output.dir=ragged \
    --weights ragged/model.safetensors >eval-$f.log 2>&1 || { cat eval-$f.log; fail "eval $f"; }
done
"$PY" - <<'PYEOF' || fail "ragged eval: not the mean of its cases"
import json
e = {f: json.loads([l for l in open(f"eval-{f}.log") if '"type":"eval"' in l][-1])
     for f in ("rval", "rcase0", "rcase1")}
loss = (e["rcase0"]["val_loss"] + e["rcase1"]["val_loss"]) / 2
print(f"ragged eval: val_loss {e['rval']['val_loss']:.6f}, mean of the cases {loss:.6f}")
assert abs(e["rval"]["val_loss"] - loss) <= 1e-5 * max(1, abs(loss)), (e["rval"], loss)
for c in range(len(e["rval"]["val_dice_per_class"])):
    a, b = e["rcase0"]["val_dice_per_class"][c], e["rcase1"]["val_dice_per_class"][c]
    m = (a + b) / 2
    assert abs(e["rval"]["val_dice_per_class"][c] - m) <= 1e-5, (c, e["rval"], a, b)
PYEOF
echo "e2e volumes: ok"
