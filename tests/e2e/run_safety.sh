#!/usr/bin/env bash
# Runs that cannot destroy or waste work, and what a run keeps:
# 1. A fresh run into an output.dir holding another run is refused (exit 2,
#    the ways out named) and changes nothing there; --output.overwrite=true
#    replaces that run; --resume auto continues it.
# 2. training.lr_schedule=cosine with warmup: metrics.jsonl's lr is the
#    formula's value for every window; best.safetensors holds the weights of
#    the epoch with the best val_accuracy, and says which.
# 3. SIGUSR1 on an epoch's last window with whole-volume validation: the
#    checkpoint is written and the run exits 3 without validating; the
#    resumed run validates that epoch first.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out train.h5 --samples 256 >/dev/null
"$MEMTRAIN" make-data --kind features --out val.h5 --samples 64 --split val >/dev/null
F=(--data.train=train.h5 --data.val=val.h5 --output.progress=lines)

# 1. The used folder.
mpi -np 2 "$MEMTRAIN" train "${F[@]}" --training.epochs=2 --output.dir=used \
  >first.log 2>&1 || { cat first.log; fail "first run"; }
before=$(cd used && md5sum metrics.jsonl model.safetensors checkpoints/*)
rc=0
mpi -np 2 "$MEMTRAIN" train "${F[@]}" --training.epochs=1 --output.dir=used \
  >second.log 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat second.log; fail "a fresh run into a used folder: exit $rc, want 2"; }
grep -q "output.dir 'used' holds another run" second.log || { cat second.log; fail "no message"; }
grep -q -- "--resume auto" second.log && grep -q -- "--output.overwrite=true" second.log ||
  fail "the message names no way out"
[ "$(grep -c "holds another run" second.log)" = 1 ] || fail "the message is not printed once"
[ "$before" = "$(cd used && md5sum metrics.jsonl model.safetensors checkpoints/*)" ] ||
  fail "the refused run changed the folder"
echo "used folder: refused, nothing changed: $(grep -o "holds another run ([^)]*)" second.log)"
mpi -np 2 "$MEMTRAIN" train "${F[@]}" --training.epochs=1 --output.dir=used \
  --output.overwrite=true >third.log 2>&1 || { cat third.log; fail "overwrite"; }
"$PY" - <<'PYEOF' || fail "overwrite left the first run's records"
import json
recs = [json.loads(l) for l in open("used/metrics.jsonl")]
epochs = {r["epoch"] for r in recs if r["type"] == "epoch"}
assert epochs == {0}, f"epochs in metrics.jsonl after overwrite: {epochs}"
PYEOF
[ "$(ls used/checkpoints)" = ckpt-00000008.safetensors ] ||
  { ls used/checkpoints; fail "checkpoints after the overwrite"; }
echo "--output.overwrite=true: the first run's records and checkpoints are gone"

# 2. Schedule and best.safetensors, one rank: 16 windows per epoch, 3 epochs.
"$MEMTRAIN" train "${F[@]}" --training.epochs=3 --training.lr=0.08 \
  --training.lr_schedule=cosine --training.warmup_windows=5 --training.min_lr=0.002 \
  --output.dir=sched >sched.log 2>&1 || { cat sched.log; fail "schedule run"; }
"$PY" - "$PEER_SCRIPTS" <<'PYEOF' || fail "lr schedule or best.safetensors"
import json, math, sys
sys.path.insert(0, sys.argv[1])
import safetensors_read as st
recs = [json.loads(l) for l in open("sched/metrics.jsonl")]
win = [r for r in recs if r["type"] == "window"]
total, warm, lr, lo = 48, 5, 0.08, 0.002
assert len(win) == total, len(win)
for s, r in enumerate(win):
    want = lr * (s + 1) / warm if s < warm else \
        lo + (lr - lo) * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
    assert abs(r["lr"] - want) <= 1e-12 * lr, (s, r["lr"], want)
print(f"lr: {len(win)} windows follow warmup 5 + cosine to 0.002 "
      f"(first {win[0]['lr']:.4f}, peak {max(r['lr'] for r in win):.4f}, last {win[-1]['lr']:.5f})")
val = [r for r in recs if r["type"] == "validation"]
best = max(range(len(val)), key=lambda i: (val[i]["val_accuracy"], -i))
flags = [bool(r.get("best")) for r in val]
_, meta = st.load("sched/best.safetensors")
assert meta["best_metric"] == "val_accuracy", meta
assert float(meta["best_value"]) == val[best]["val_accuracy"], (meta, val[best])
assert int(meta["epoch"]) == best + 1, (meta, best)
assert flags[best], flags
print(f"best.safetensors: epoch {meta['epoch']} val_accuracy {meta['best_value']} "
      f"(validations {[r['val_accuracy'] for r in val]}, best flags {flags})")
PYEOF

# 3. SIGUSR1 on an epoch's last window, whole-volume validation: one window
#    per epoch, so every window is its epoch's last.
"$MEMTRAIN" make-data --kind volumes --out vtrain.h5 --samples 2 --channels 1 \
  --depth 32 --height 32 --width 32 --classes 3 --split train >/dev/null
"$MEMTRAIN" make-data --kind volumes --out vval.h5 --samples 2 --channels 1 \
  --depth 48 --height 48 --width 48 --classes 3 --split val >/dev/null
V=(--data.train=vtrain.h5 --data.val=vval.h5 --model.name=unet3d --model.feature_size=8
   --model.depth=3 --data.patch_size=16 --data.patches_per_volume=8 --data.batch_size=4
   --training.effective_batch_size=16 --training.epochs=2 --output.progress=lines)
mpi -np 2 "$MEMTRAIN" train "${V[@]}" --output.dir=sig >sig.log 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^memory plan:" sig.log 2>/dev/null && break; sleep 0.05; done
pkill -USR1 -f "^$MEMTRAIN train .*--output.dir=sig" || fail "no rank to signal"
# More signals while the window computes: a handler that interrupted
# oneDNN's convolution backward crashed a rank (SIGSEGV or SIGABRT in about
# half such runs) before the signals were given a thread of their own.
( for _ in $(seq 300); do
    pkill -USR1 -f "^$MEMTRAIN train .*--output.dir=sig" || break
    sleep 0.002
  done ) &
burst=$!
rc=0
wait "$job" || rc=$?
wait "$burst" || true
[ "$rc" = 3 ] || { cat sig.log; fail "SIGUSR1: exit $rc, want 3"; }
grep -q "the epoch's validation runs on --resume" sig.log || { cat sig.log; fail "no stop line"; }
"$PY" - <<'PYEOF' || fail "stop before validation"
import json
recs = [json.loads(l) for l in open("sig/metrics.jsonl")]
types = [r["type"] for r in recs]
# The stop lands on the window the signal reaches: the first (epoch 0's
# last), or, when that window was done before the signal came, the second
# (epoch 1's last). Either way: its checkpoint, and no validation after it.
assert types in (["window", "checkpoint"],
                 ["window", "validation", "epoch", "checkpoint", "window", "checkpoint"]), types
print(f"SIGUSR1 on the epoch's last window: records {types}, checkpoint in "
      f"{recs[-1]['seconds']:.3f} s, no validation")
PYEOF
mpi -np 2 "$MEMTRAIN" train "${V[@]}" --output.dir=sig --resume auto >resume.log 2>&1 ||
  { cat resume.log; fail "resume"; }
"$PY" - <<'PYEOF' || fail "the resumed run's records"
import json
recs = [json.loads(l) for l in open("sig/metrics.jsonl")]
seq = [(r["type"], r.get("epoch")) for r in recs if r["type"] in ("window", "validation", "epoch")]
assert seq == [("window", 0), ("validation", 0), ("epoch", 0),
               ("window", 1), ("validation", 1), ("epoch", 1)], seq
print(f"resumed: {seq}")
PYEOF
echo "e2e run_safety: ok"
