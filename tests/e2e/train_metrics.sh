#!/usr/bin/env bash
# Two ranks train the MLP on synthetic features with accumulation 1 and 8:
# the loss falls, validation is recorded, model.safetensors is readable by an
# independent reader, the gradient moves once per window (equal bytes per
# window, 8x fewer bytes per sample), and the progress output of a non-TTY
# run stays short. Then the CNN on uint8 images, one epoch.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out data/train.h5 --samples 2048
"$MEMTRAIN" make-data --kind features --out data/val.h5 --samples 512 --split val

for k in 1 8; do
  # k=8 with an OMP_NUM_THREADS larger than a rank's share: it is capped.
  omp=$([ $k = 8 ] && echo 64 || echo "")
  OMP_NUM_THREADS=$omp mpi -np 2 "$MEMTRAIN" train --data.train=data/train.h5 --data.val=data/val.h5 \
    --data.batch_size=8 --training.gradient_accumulation_steps=$k \
    --training.epochs=3 --training.lr=$([ $k = 1 ] && echo 0.05 || echo 0.2) \
    --output.dir=out/k$k >log_k$k.txt 2>&1 || { cat log_k$k.txt; fail "train k=$k"; }
  "$PY" "$TOOLS/check_metrics.py" out/k$k 3 --min-val-acc 0.85
  # Each rank's device, in environment.json and the banner.
  "$PY" -c "import json,sys; e=json.load(open('out/k$k/environment.json')); d=[r['device'] for r in e['ranks']]; sys.exit(0 if d==['cpu','cpu'] else 'devices %s' % d)"
  # Threads from each rank's CPU share, never more than the machine's
  # CPUs in all (Note [Threads per rank]); the BLAS each rank loaded is
  # the one the libblas.so.3 alternative points at (OpenBLAS, installed by
  # install_deps.sh).
  "$PY" - out/k$k/environment.json "$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)" "$omp" <<'PYEOF'
import json, os, sys
e = json.load(open(sys.argv[1]))
ranks = e["ranks"]
threads = [r["threads"] for r in ranks]
assert all(t >= 1 for t in threads), threads
assert sum(threads) <= max(os.cpu_count(), len(ranks)), (threads, os.cpu_count())
assert all(r["blas"] == sys.argv[2] for r in ranks), ([r["blas"] for r in ranks], sys.argv[2])
assert "openblas" in sys.argv[2], "libblas.so.3 is not OpenBLAS: " + sys.argv[2]
if sys.argv[3]:
    assert all("OMP_NUM_THREADS=64 capped" in r["threads_from"] for r in ranks), ranks
PYEOF
  grep -q "rank 1: host .*device cpu" log_k$k.txt || fail "no device in the banner"
  # progress lines only (the log also holds the resolved config)
  lines=$(grep -c "window [0-9]*/" log_k$k.txt || true)
  [ "$lines" -lt 20 ] || fail "progress flooded a non-TTY log: $lines lines"
done

"$PY" - <<'PYEOF'
import json
def windows(d):
    return [json.loads(l) for l in open(f"out/{d}/metrics.jsonl")
            if json.loads(l)["type"] == "window"]
w1, w8 = windows("k1"), windows("k8")
b1 = {w["allreduce_bytes"] for w in w1}
b8 = {w["allreduce_bytes"] for w in w8}
assert len(b1) == 1 and b1 == b8, (b1, b8)
assert all(w["allreduce_calls"] == 1 for w in w1 + w8)
per_sample_1 = w1[0]["allreduce_bytes"] / w1[0]["effective_batch"]
per_sample_8 = w8[0]["allreduce_bytes"] / w8[0]["effective_batch"]
assert abs(per_sample_1 / per_sample_8 - 8.0) < 1e-9, (per_sample_1, per_sample_8)
assert w1[0]["effective_batch"] == 16 and w8[0]["effective_batch"] == 128
assert len(w1) == 3 * 128 and len(w8) == 3 * 16, (len(w1), len(w8))
print(f"ok: {b1.pop()} bytes per window at accumulation 1 and 8; "
      f"{per_sample_1:.1f} vs {per_sample_8:.1f} bytes per sample")
PYEOF

"$MEMTRAIN" make-data --kind images --dtype uint8 --out data/img.h5 --samples 512 --height 8 --width 8
"$MEMTRAIN" make-data --kind images --dtype uint8 --out data/img_val.h5 --samples 128 --height 8 --width 8 --split val
mpi -np 2 "$MEMTRAIN" train --model.name=cnn --model.hidden=8 \
  --data.train=data/img.h5 --data.val=data/img_val.h5 --data.batch_size=8 \
  --training.epochs=2 --training.optimizer=adamw --training.lr=0.01 \
  --training.momentum=0 --output.dir=out/cnn >log_cnn.txt 2>&1 || { cat log_cnn.txt; fail "cnn"; }
"$PY" "$TOOLS/check_metrics.py" out/cnn 2 --min-val-acc 0.9
echo "e2e train_metrics: ok"
