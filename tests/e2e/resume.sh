#!/usr/bin/env bash
# Checkpoint and resume through the executable, 2 ranks: a run stopped
# mid-epoch (training.max_windows) and resumed with --resume auto writes the
# same metrics.jsonl losses, line by line, as the uninterrupted run; a
# truncated newest checkpoint is skipped by --resume auto (older one used,
# with a message) and refused when named; a checkpoint of another model is
# refused with exit status 2 and nothing in output.dir changes.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out train.h5 --samples 1024
"$MEMTRAIN" make-data --kind features --out val.h5 --samples 256 --split val
A="--data.train=train.h5 --data.val=val.h5 --model.dropout=0.2 --training.epochs=3 --training.checkpoint_every=10"
mpi -np 2 "$MEMTRAIN" train $A --output.dir=full >full.log 2>&1 || { cat full.log; fail full; }
mpi -np 2 "$MEMTRAIN" train $A --output.dir=part --training.max_windows=37 >part1.log 2>&1 || { cat part1.log; fail part1; }
mpi -np 2 "$MEMTRAIN" train $A --output.dir=part --resume=auto >part2.log 2>&1 || { cat part2.log; fail part2; }
grep -q "resumed from part/checkpoints/ckpt-00000037.safetensors at step 37" part2.log || { cat part2.log; fail "no resume line"; }
"$PY" - <<'PYEOF'
import json
def recs(d):
    keep = ("type", "step", "epoch", "loss", "train_loss", "val_loss", "val_accuracy")
    return [{k: v for k, v in j.items() if k in keep}
            for j in map(json.loads, open(d + "/metrics.jsonl"))
            if j["type"] in ("window", "epoch")]
a, b = recs("full"), recs("part")
assert len(a) == len(b) == 99, (len(a), len(b))
for x, y in zip(a, b):
    assert x == y, (x, y)
print(f"resume: {len(a)} window and epoch records identical")
PYEOF
d=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" full/model.safetensors part/model.safetensors)
[ "$d" = "0.000e+00" ] || fail "final weights differ by $d"

# Truncate the newest checkpoint: auto falls back to the older one.
newest=$(ls part/checkpoints/ckpt-*.safetensors | sort | tail -1)
older=$(ls part/checkpoints/ckpt-*.safetensors | sort | tail -2 | head -1)
truncate -s 1000 "$newest"
rc=0
mpi -np 2 "$MEMTRAIN" train $A --output.dir=part --resume="$newest" >bad.log 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat bad.log; fail "truncated checkpoint: exit $rc"; }
grep -q "checkpoint '$newest' cannot be read" bad.log || { cat bad.log; fail "no message"; }
mpi -np 2 "$MEMTRAIN" train $A --output.dir=part --resume=auto >auto.log 2>&1 || { cat auto.log; fail auto; }
grep -q "resumed from $older" auto.log || { cat auto.log; fail "older checkpoint not used"; }
grep -q "skipped: checkpoint '$newest'" auto.log || fail "skip not reported"
# The resumed run wrote its own checkpoint of that step over the truncated
# one: the next --resume auto takes it, skipping nothing.
mpi -np 2 "$MEMTRAIN" train $A --output.dir=part --resume=auto >auto2.log 2>&1 || { cat auto2.log; fail "auto after prune"; }
grep -q "resumed from $newest" auto2.log || { cat auto2.log; fail "the rewritten checkpoint was not used"; }
! grep -q "skipped:" auto2.log || fail "a checkpoint is still invalid"

# Another model: refused, exit 2, output.dir untouched.
before=$(cd part && find . -type f ! -name 'rank-*.log' -exec md5sum {} + | sort)
rc=0
mpi -np 2 "$MEMTRAIN" train $A --output.dir=part --model.depth=3 --resume="$older" >other.log 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat other.log; fail "other model: exit $rc"; }
grep -q "parameter tensors" other.log || { cat other.log; fail "no shape message"; }
after=$(cd part && find . -type f ! -name 'rank-*.log' -exec md5sum {} + | sort)
[ "$before" = "$after" ] || fail "a refused resume changed output.dir"
echo "e2e resume: ok"
