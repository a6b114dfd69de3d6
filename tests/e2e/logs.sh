#!/usr/bin/env bash
# The logs people look at, through the executable (2 ranks, unet3d on
# synthetic volumes whose file names its classes):
# 1. output.dir/tb read by TensorBoard's own package (tests/peers/read_tb.py:
#    tags, steps, values equal to metrics.jsonl, CRCs checked); metrics.csv
#    rows = the window records, equal values; progress.png drawn once per
#    epoch (a gnuplot wrapper counts the calls), 1000x900; one overlay PNG
#    per validation volume per validation, 3 panels of the 24x24 slice x 11.
# 2. Resumed from an earlier checkpoint (a mid-epoch one): TensorBoard shows
#    each step once (the orphaned steps of the first run purged), the CSV is
#    the trimmed and continued metrics.jsonl, progress.png redrawn.
# 3. memtrain plot of two runs; a folder without metrics; no gnuplot.
# 4. A gnuplot that fails: the run goes on, one warning line.
source "$(dirname "$0")/common.sh"
PEERS=${MEMTRAIN_PEERS_VENV:-/opt/memtrain/peers-venv}/bin/python
[ -x "$PEERS" ] || fail "no TensorBoard peer at $PEERS: bash launch/install_peers.sh"
GNUPLOT=$(command -v gnuplot) || fail "gnuplot not installed (launch/install_deps.sh)"
H5PY=/usr/bin/python3  # Debian's, with python3-h5py (install_deps.sh)
"$H5PY" -c "import h5py" || fail "no h5py in $H5PY (apt-get install python3-h5py)"

for split in train val; do
  "$MEMTRAIN" make-data --kind volumes --out $split.h5 --samples 2 --channels 1 \
    --depth 24 --height 24 --width 24 --classes 3 --noise 0.7 --split $split \
    --chunk 8 >/dev/null || fail "make-data $split"
  "$H5PY" -c "import h5py, numpy; h5py.File('$split.h5', 'r+').attrs['class_names'] = numpy.bytes_('background,liver,tumour')"
done
mkdir bin
printf '#!/bin/sh\necho call >>"%s/gnuplot_calls"\nexec "%s" "$@"\n' "$PWD" "$GNUPLOT" >bin/gnuplot
chmod +x bin/gnuplot
A=(--model.name=unet3d --model.feature_size=4 --model.depth=2 --model.norm=instance
   --data.patch_size=16 --data.patches_per_volume=8 --data.batch_size=2
   --data.train=train.h5 --data.val=val.h5 --training.optimizer=adamw
   --training.lr=0.003 --training.epochs=3 --training.checkpoint_every=1
   --training.keep_checkpoints=20 --memory.budget=256MiB)
train() {  # NAME ARGS...
  local name=$1 start=$SECONDS
  shift
  MEMTRAIN_GNUPLOT=$PWD/bin/gnuplot timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train \
    "${A[@]}" --output.dir="$name" "$@" >"$name.log" 2>&1 || { tail -30 "$name.log"; fail "$name"; }
  echo "$name: $((SECONDS - start)) s"
}
png_size() {  # PNG -> "WIDTHxHEIGHT", or fails
  "$PY" -c "
import struct, sys
d = open('$1', 'rb').read(24)
assert d[:8] == b'\x89PNG\r\n\x1a\n' and d[12:16] == b'IHDR', 'not a PNG: $1'
print('%dx%d' % struct.unpack('>II', d[16:24]))"
}
check_csv() {  # RUN: metrics.csv rows = window records, equal values
  "$PY" - "$1" <<'PYEOF' || fail "$1/metrics.csv"
import csv, json, sys
run = sys.argv[1]
recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
win = [r for r in recs if r["type"] == "window"]
rows = list(csv.DictReader(open(f"{run}/metrics.csv")))
assert len(rows) == len(win), (len(rows), len(win))
epochs = {r["epoch"]: r for r in recs if r["type"] == "epoch"}
vals = {r["epoch"]: r for r in recs if r["type"] == "validation"}
for row, w in zip(rows, win):
    for k in ("step", "epoch", "window", "loss", "lr", "samples_per_s", "mem_peak", "mem_reserved"):
        assert float(row[k]) == w[k], (k, row[k], w[k])
    last = w is [x for x in win if x["epoch"] == w["epoch"]][-1]
    e = epochs.get(w["epoch"]) if last else None
    assert (row["train_loss"] != "") == (e is not None), (w["step"], row["train_loss"])
    if e:
        assert float(row["train_loss"]) == e["train_loss"]
        assert float(row["val_dice"]) == e["val_dice"]
        per = vals[w["epoch"]]["val_dice_per_class"]
        for name, d in zip(["background", "liver", "tumour"], per):
            assert (row["val_dice_" + name] == "") == (d is None)
            assert d is None or float(row["val_dice_" + name]) == d
print(f"{run}/metrics.csv: {len(rows)} rows equal to the window records, {len(epochs)} epoch rows")
PYEOF
}

# 1. A run of 3 epochs (with a memory budget: memory/peak_of_budget).
train full
[ "$(wc -l <gnuplot_calls)" = 3 ] || fail "gnuplot ran $(wc -l <gnuplot_calls) times for 3 epochs"
[ "$(png_size full/progress.png)" = 1000x900 ] || fail "progress.png $(png_size full/progress.png)"
for e in 001 002 003; do
  for c in 000 001; do
    [ "$(png_size full/val/epoch-$e/case-$c.png)" = 792x264 ] || fail "overlay epoch $e case $c"
  done
done
[ "$(ls full/val/*/ | grep -c png)" = 6 ] || fail "overlays: $(ls -R full/val)"
! ls full/*.tmp* full/val/*/*.tmp* 2>/dev/null || fail "temporary files left"
check_csv full
"$PEERS" "$PEER_SCRIPTS/read_tb.py" full background liver tumour || fail "full/tb"

# 2. Resumed from step 5 (the first window of epoch 2) in a copy.
cp -r full res
inode=$(stat -c %i res/progress.png)
train res --resume=res/checkpoints/ckpt-00000005.safetensors
grep -q "at step 5" res.log || fail "not resumed at step 5"
[ "$(ls res/tb | wc -l)" = 2 ] || fail "want 2 event files: $(ls res/tb)"
[ "$(stat -c %i res/progress.png)" != "$inode" ] || fail "progress.png not redrawn"
check_csv res
"$PEERS" "$PEER_SCRIPTS/read_tb.py" res background liver tumour || fail "res/tb"

# 3. memtrain plot.
"$MEMTRAIN" plot full res --out cmp.png >plot.log 2>&1 || { cat plot.log; fail "plot"; }
[ "$(png_size cmp.png)" = 1000x900 ] || fail "cmp.png"
mkdir empty
rc=0
"$MEMTRAIN" plot full empty --out bad.png >bad.log 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "'empty' has no metrics.jsonl" bad.log || { cat bad.log; fail "plot of a folder without metrics: status $rc"; }
rc=0
PATH=/nonexistent "$MEMTRAIN" plot full --out none.png >none.log 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "gnuplot not found" none.log && [ ! -e none.png ] || { cat none.log; fail "plot without gnuplot: status $rc"; }

# 4. A gnuplot that fails: one warning line, the run goes on.
printf '#!/bin/sh\necho "broken gnuplot" >&2\nexit 1\n' >bin/gnuplot
train broken --training.epochs=2
[ "$(grep -c "progress.png not drawn" broken.log)" = 1 ] || { cat broken.log; fail "want one warning line"; }
grep -q "gnuplot failed (status 1): broken gnuplot" broken.log || fail "warning without gnuplot's message"
[ ! -e broken/progress.png ] || fail "progress.png from a failing gnuplot"
echo "e2e logs: ok"
