#!/usr/bin/env bash
# The regression task (docs/data-format.md "Targets", docs/models.md "Regression"):
# 1. make-data --kind regression; inspect names the targets.
# 2. 2 ranks, 3 epochs: validation and epoch records carry val_mae and
#    val_rmse (val_loss = RMSE squared), metrics.csv their columns with
#    the same values, the progress line both; best.safetensors is chosen by
#    val_mae (auto: the task's first metric, lower is better); the RMSE
#    falls. 2b: validation.best_metric=val_rmse ranks by the RMSE.
# 3. memtrain eval of model.safetensors at 1 and 2 ranks reports the last
#    validation's MAE and RMSE.
# 4. Choices of other tasks are refused with exit 2: model.num_classes=1,
#    validation.best_metric=val_accuracy.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

mk() {  # OUT ROWS SPLIT
  "$MEMTRAIN" make-data --kind regression --samples "$2" --features 16 \
    --targets 3 --noise 0.2 --seed 7 --split "$3" --out "$1" >/dev/null ||
    fail "make-data $1"
}
common=(--data.train=train.h5 --data.val=val.h5 --model.hidden=32
  --data.batch_size=16 --training.effective_batch_size=32
  --training.optimizer=adamw --training.momentum=0 --training.lr=0.01)

# 1. The data.
mk train.h5 512 train
mk val.h5 96 val
"$MEMTRAIN" inspect val.h5 >inspect.txt || { cat inspect.txt; fail "inspect"; }
grep -q "96 samples of shape \[16\] float32, 3 targets a row (/targets: regression)" inspect.txt ||
  { cat inspect.txt; fail "inspect does not name the targets"; }

# 2. Two ranks, three epochs.
rc=0
timeout 300 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train "${common[@]}" \
  --training.epochs=3 --output.dir=fit >fit.log 2>&1 || rc=$?
[ "$rc" = 0 ] || { tail -30 fit.log; fail "fit: exit status $rc"; }
grep -q "3 targets a row" fit.log || { cat fit.log; fail "banner: no targets"; }
grep -q "3 outputs: regression (MSE)" fit.log || { cat fit.log; fail "banner: no outputs"; }
grep -q "val loss .*, val MAE .*, val RMSE " fit.log || { cat fit.log; fail "no progress line"; }
"$PY" - <<'PYEOF' || fail "fit: records"
import csv, json, math, struct
recs = list(map(json.loads, open("fit/metrics.jsonl")))
val = [j for j in recs if j["type"] == "validation"]
epochs = [j for j in recs if j["type"] == "epoch"]
assert len(val) == 3 and len(epochs) == 3, (len(val), len(epochs))
for v, e in zip(val, epochs):
    assert v["val_samples"] == 96, v
    assert abs(v["val_loss"] - v["val_rmse"] ** 2) <= 1e-12 * v["val_loss"], v
    assert 0 < v["val_mae"] <= v["val_rmse"], v  # MAE <= RMSE always
    assert e["val_mae"] == v["val_mae"] and e["val_rmse"] == v["val_rmse"], (e, v)
rmse = [v["val_rmse"] for v in val]
assert rmse[-1] < rmse[0], rmse
rows = [r for r in csv.DictReader(open("fit/metrics.csv")) if r["val_mae"]]
assert len(rows) == 3, len(rows)
for r, v in zip(rows, val):
    assert float(r["val_mae"]) == v["val_mae"] and float(r["val_rmse"]) == v["val_rmse"], (r, v)
assert "val_accuracy" not in rows[0], "a regression has no accuracy column"
# best.safetensors: the epoch of the lowest val_mae.
raw = open("fit/best.safetensors", "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
best = min(v["val_mae"] for v in val)
assert meta["best_metric"] == "val_mae", meta
assert float(meta["best_value"]) == best, (meta, best)
print("fit: val_mae", [round(v["val_mae"], 4) for v in val],
      "val_rmse", [round(x, 4) for x in rmse], "best epoch", meta["epoch"])
PYEOF

# 2b. A metric that only this task reports ranks epochs when named:
#     best.safetensors follows val_rmse (lower is better) at one rank.
rc=0
timeout 300 "$MPIEXEC" --oversubscribe -np 1 "$MEMTRAIN" train "${common[@]}" \
  --training.epochs=2 --validation.best_metric=val_rmse --output.dir=rmse \
  >rmse.log 2>&1 || rc=$?
[ "$rc" = 0 ] || { tail -30 rmse.log; fail "rmse: exit status $rc"; }
"$PY" - <<'PYEOF' || fail "rmse: best.safetensors"
import json, struct
val = [j for j in map(json.loads, open("rmse/metrics.jsonl")) if j["type"] == "validation"]
assert [v["val_metrics"] for v in val] == [[{"key": "val_mae", "better": "lower"},
    {"key": "val_rmse", "better": "lower"}]] * 2, val[0].get("val_metrics")
raw = open("rmse/best.safetensors", "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
best = min(v["val_rmse"] for v in val)
assert meta["best_metric"] == "val_rmse" and float(meta["best_value"]) == best, (meta, best)
print("rmse: best val_rmse", best, "epoch", meta["epoch"])
PYEOF

# 3. eval of the final weights = the last validation.
last=$("$PY" -c 'import json
v=[j for j in map(json.loads,open("fit/metrics.jsonl")) if j["type"]=="validation"][-1]
print(v["val_mae"], v["val_rmse"])')
for np in 1 2; do
  mpi -np $np "$MEMTRAIN" eval "${common[@]}" --weights fit/model.safetensors \
    >eval$np.log 2>&1 || { cat eval$np.log; fail "eval np $np"; }
  grep '"type":"eval"' eval$np.log >eval$np.json || { cat eval$np.log; fail "no eval record"; }
  "$PY" - "$last" eval$np.json <<'PYEOF' || fail "eval np $np differs from the run's validation"
import json, sys
mae, rmse = map(float, sys.argv[1].split())
e = json.loads(open(sys.argv[2]).read())
for k, want in (("val_mae", mae), ("val_rmse", rmse)):
    assert abs(e[k] - want) <= 1e-6 * want, (k, e[k], want)
print("eval:", e["ranks"], "rank(s): val_mae", e["val_mae"], "val_rmse", e["val_rmse"])
PYEOF
done

# 4. Refused with a message and exit 2.
refused() {  # NAME EXPECT ARGS...
  local name=$1 expect=$2 rc=0
  shift 2
  mpi -np 2 "$MEMTRAIN" train "${common[@]}" --output.dir="$name" "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "$name.log"; fail "$name: exit $rc, want 2"; }
  grep -q -- "$expect" "$name.log" || { cat "$name.log"; fail "$name: no message '$expect'"; }
}
refused binary "model.num_classes=1 (a binary classifier) applies to /features and /images rows, but data.train 'train.h5' is trained as regression (/targets)" \
  --model.num_classes=1
refused accuracy "validation.best_metric=val_accuracy: this run reports val_mae, val_rmse (a regression) and val_loss" \
  --validation.best_metric=val_accuracy
echo "e2e regression: ok"
