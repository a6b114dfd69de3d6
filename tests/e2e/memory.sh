#!/usr/bin/env bash
# The memory issue's checks through the executable, 2 ranks:
# - a fixed micro-batch that does not fit memory.budget recovers
#   (oom_retries > 0) and ends with the model.safetensors of a run started at
#   the smaller micro-batch (max abs difference < 1e-5);
# - batch_size auto under the same budget ends with mem_peak below it and
#   micro x steps x ranks equal to the effective batch; memory_plan.json's
#   probes bracket the chosen micro-batch (it is the largest that fits,
#   the next one up was probed and does not), each with its tier, peak,
#   host bytes and time per sample (a time where it fits, none where it
#   does not), the plan's predicted peak the chosen probe's, and the
#   banner lists the same probes in the same order;
# - checkpointing all vs off: equal weights, at most 60% of the peak;
# - an injected leak (test hook) produces the warning;
# - bf16 autocast trains;
# - a run under memory.host_budget peaks within 5% of it.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out train.h5 --samples 1024 --features 64
run() {  # NAME ARGS...
  local name=$1
  shift
  mpi -np 2 "$MEMTRAIN" train --data.train=train.h5 --data.val= \
    --model.depth=4 --model.hidden=64 --training.epochs=1 \
    --output.dir="$name" "$@" >"$name.log" 2>&1 || { cat "$name.log"; fail "$name"; }
}
peak() {  # DIR -> the largest mem_peak_reserved of its windows
  "$PY" -c "import json,sys; print(max(json.loads(l)['mem_peak_reserved'] for l in open(sys.argv[1]+'/metrics.jsonl') if '\"window\"' in l))" "$1"
}

# 1. OOM recovery.
run m32 --data.batch_size=32 --training.effective_batch_size=128
run m16 --data.batch_size=16 --training.effective_batch_size=128
p32=$(peak m32)
p16=$(peak m16)
budget=$(((p16 + p32) / 2))
echo "peaks: micro 32 $p32 B, micro 16 $p16 B; budget $budget B"
run oom --data.batch_size=32 --training.effective_batch_size=128 --memory.budget=$budget
retries=$("$PY" -c "import json; print(sum(json.loads(l).get('oom_retries',0) for l in open('oom/metrics.jsonl') if '\"window\"' in l))")
diff=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" oom/model.safetensors m16/model.safetensors)
echo "oom_retries $retries, max |oom - m16| = $diff"
[ "$retries" -gt 0 ] || fail "no OOM retry recorded"
grep -q "replaying the window at micro-batch 16" oom.log || fail "no replay message"
"$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1e-5 else 1)" "$diff" || fail "weights differ"

# 1a. An OOM on rank 1 only (injected) is in rank 0's metrics.jsonl: the
#     largest retries, the rank that had them, the sum over ranks.
run oom1 --data.batch_size=32 --training.effective_batch_size=128 --memory.test_oom_rank=1
"$PY" - <<'PYEOF' || fail "rank 1's OOM retry not in metrics.jsonl"
import json
w = [json.loads(l) for l in open("oom1/metrics.jsonl") if '"window"' in l]
first = w[0]
print("oom on rank 1: first window", {k: first[k] for k in
      ("oom_retries", "oom_retries_rank", "oom_retries_total", "micro_batch")})
assert (first["oom_retries"], first["oom_retries_rank"],
        first["oom_retries_total"]) == (1, 1, 1), first
assert all(x["oom_retries_total"] == 0 for x in w[1:])
PYEOF
grep -q "\[rank 1\] out of device memory at micro-batch 32" oom1/rank-1.log || fail "no replay in rank-1.log"

# 1b. Out of retries: the job stops on every rank, naming budget, micro-batch
#     and peak; no model is written.
rc=0
timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --data.train=train.h5 --data.val= \
  --model.depth=4 --model.hidden=64 --training.epochs=1 --output.dir=giveup \
  --data.batch_size=32 --training.effective_batch_size=128 --memory.budget=$budget \
  --memory.max_oom_retries=0 >giveup.log 2>&1 || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat giveup.log; fail "give-up: exit $rc"; }
grep -q "does not fit memory.budget=$budget" giveup.log || { cat giveup.log; fail "no budget in message"; }
grep -q "even at micro-batch 32" giveup.log || fail "no micro-batch in message"
grep -q "measured peak" giveup.log || fail "no peak in message"
[ ! -e giveup/model.safetensors ] || fail "a model was written by a failed run"
echo "give-up: exit $rc: $(grep -m1 'out of device memory: ' giveup.log | cut -c1-160)..."

# 2. Auto-fit under the same budget (needs room for at least 1 sample).
run auto --data.batch_size=auto --training.effective_batch_size=128 --memory.budget=2.2MiB
"$PY" - <<'PYEOF'
import json
w = [json.loads(l) for l in open("auto/metrics.jsonl") if '"window"' in l]
plan = json.load(open("auto/memory_plan.json"))
budget = plan["budget_bytes"]
peak = max(x["mem_peak_reserved"] for x in w)
micro, steps, world = plan["micro_batch"], plan["accumulation_steps"], plan["world_size"]
assert peak < budget, (peak, budget)
assert micro * steps * world == w[0]["effective_batch"] == 128, (micro, steps, world)
assert all(x["oom_retries"] == 0 for x in w)
print(f"auto: micro {micro} x {steps} steps x {world} ranks = 128; peak {peak} < budget {budget}; "
      f"predicted {plan['predicted_peak_bytes']}, measured {plan['measured_peak_bytes']}")
# The host holders of the rank with the largest resident set: the counted
# ones add up to what is counted, outside is the rest of the resident set.
for x in w:
    h = x["host_holders"]
    assert h["CPU device"] + h["offload pool"] + h["host buffers"] == x["host_counted"], (h, x["host_counted"])
    assert h["outside"] == x["host_rss"] - x["host_counted"] > 0, (h, x["host_rss"])
    assert 0 < h["CPU device"] <= x["mem_reserved"], (h, x["mem_reserved"])
    assert h["outside_glibc_used"] > 0 and h["outside_files"] == x["host_rss_file"] > 0, h
print("host holders, last window (MiB):", {k: round(v / 2**20, 1) for k, v in w[-1]["host_holders"].items()})
# The probes: in the plan and in the banner, the same, in order.
probes = plan["probes"]
fit = [p["micro_batch"] for p in probes if p["fits"]]
assert micro == max(fit), (micro, fit)
above = [p for p in probes if p["micro_batch"] == micro + 1]
assert len(above) == 1 and not above[0]["fits"], above
chosen = [p for p in probes if p["micro_batch"] == micro]
assert chosen[0]["peak_bytes"] == plan["predicted_peak_bytes"], (chosen, plan["predicted_peak_bytes"])
for p in probes:
    assert p["tier"] == "0/4 segments" and p["checkpointed_segments"] == 0, p
    assert p["host_bytes"] == 0 and not p["offload"], p  # nothing offloaded
    assert p["peak_bytes"] > 0, p
    assert (p["seconds_per_sample"] > 0) == p["fits"], p
    if p["fits"]:
        assert p["peak_bytes"] <= plan["usable_bytes"], (p, plan["usable_bytes"])
# Nothing offloaded: no saving to say (Note [Offload that saves nothing]).
assert plan["offload_saving_bytes"] is None and plan["offload_saving_micro_batch"] == 0, plan
lines = open("auto.log").read().split("memory probes (micro-batch, tier: peak, host bytes, time per sample):\n")[1].splitlines()
listed = [l.strip() for l in lines[:len(probes)]]
for p, l in zip(probes, listed):
    head = f"{p['micro_batch']}, {p['tier']}: "
    assert l.startswith(head), (l, head)
    assert l.endswith(" ms") == p["fits"] and l.endswith("does not fit") != p["fits"], (l, p)
assert len(listed) == len(probes) and not lines[len(probes)].startswith("  "), lines[:len(probes) + 1]
print(f"probes: {len(probes)}, micro-batches fitting {fit}, {micro + 1} does not; the banner lists them in order")
PYEOF

# 3. Checkpointing all vs off on a deep model.
for ck in off all; do
  run ck_$ck --model.depth=16 --data.batch_size=512 --training.gradient_checkpointing=$ck
done
"$PY" - <<'PYEOF'
import json
def peak(d):
    return max(json.loads(l)["mem_peak"] for l in open(f"{d}/metrics.jsonl") if '"window"' in l)
off, all_ = peak("ck_off"), peak("ck_all")
print(f"checkpointing: peak all {all_} / off {off} = {all_ / off:.3f}")
assert all_ <= 0.6 * off
PYEOF
ck=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" ck_off/model.safetensors ck_all/model.safetensors)
echo "max |all - off| = $ck"
"$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1e-6 else 1)" "$ck" || fail "checkpointed weights differ"

# 4. Leak warning from the test hook, and none without it.
run clean --data.batch_size=16 --training.epochs=4 --memory.leak_warn_mib=0.05 --memory.leak_epochs=2
run leak --data.batch_size=16 --training.epochs=4 --memory.leak_warn_mib=0.05 --memory.leak_epochs=2 \
  --memory.test_leak_kib_per_window=64
grep -q "possible memory leak" leak.log || { cat leak.log; fail "no leak warning"; }
! grep -q "possible memory leak" clean.log || fail "leak warning without a leak"
grep -q '"leak_warning"' leak/metrics.jsonl || fail "leak warning not in metrics.jsonl"

# 5. bf16 autocast with checkpointing trains.
run bf16 --data.batch_size=16 --training.epochs=3 --training.amp=bf16 --training.gradient_checkpointing=all
"$PY" -c "
import json
w=[json.loads(l)['loss'] for l in open('bf16/metrics.jsonl') if '\"window\"' in l]
a, b = sum(w[:5]) / 5, sum(w[-5:]) / 5
print(f'bf16: loss {a:.4f} -> {b:.4f}')
assert b < 0.6 * a
"

# 6. A host budget is the whole process's: one rank of a U-Net with a
#    V100's budget on the CPU device and memory.host_budget=340MiB peaks
#    within 5% of it (VmHWM of every boundary): the CPU device's cap comes
#    down to what the other holders leave after a warm-up probe.
"$MEMTRAIN" make-data --kind volumes --out vol.h5 --samples 8 --channels 1 --depth 32 \
  --height 32 --width 32 --classes 3 --noise 0.7 --chunk 16 >/dev/null
"$MEMTRAIN" train --data.train=vol.h5 --data.val= --model.name=unet3d \
  --model.feature_size=8 --model.depth=3 --model.norm=instance --data.patch_size=16 \
  --data.patches_per_volume=16 --training.effective_batch_size=128 --data.batch_size=auto \
  --training.gradient_checkpointing=auto --memory.budget=v100-16gb \
  --memory.host_budget=340MiB --training.epochs=1 --output.dir=host >host.log 2>&1 ||
  { tail -20 host.log; fail "the run under memory.host_budget=340MiB"; }
grep "^host plan" host.log
"$PY" - <<'PYEOF' || fail "the run passed its host budget by more than 5%"
import json
w = [json.loads(l) for l in open("host/metrics.jsonl") if '"window"' in l]
peak = max(x["host_rss_peak"] for x in w)
budget = json.load(open("host/memory_plan.json"))["host_budget_bytes"]
print(f"host budget {budget / 2**20:.0f} MiB: peak RSS {peak / 2**20:.1f} MiB ({peak / budget:.3f})")
assert peak <= 1.05 * budget
PYEOF
echo "e2e memory: ok"
