#!/usr/bin/env bash
# A real memory limit (issue 53, point 4; Note [Host plan]). A 2-rank U-Net
# job with a V100's budget on the CPU device (memory.budget=v100-16gb,
# batch and checkpointing auto) runs inside a memory cgroup of 1 GiB (no
# swap on the machines this runs on: the limit is the job's memory):
# 1. told a host budget above the limit (memory.host_budget=16GiB, what
#    every run assumed before the host plan read the job's limit), the job
#    plans for the V100 budget and the kernel's OOM killer ends it: exit
#    status not 0, the cgroup's oom_kill count above 0;
# 2. with memory.host_budget=auto (the default) the banner's host plan
#    names the cgroup's limit, the CPU device's cap is lowered to what the
#    holders leave, and the job finishes inside the limit with the window
#    losses of the same job run without one at the micro-batch it chose
#    (equal: checkpointing changes no gradient bit).
# cgroup v2 (memory.max, memory.swap.max) where the hierarchy's root can
# give a child the memory controller, else v1 (memory.limit_in_bytes
# under this process's own memory cgroup); neither writable (not root, a
# read-only /sys/fs/cgroup): says why and exits 77 (ctest: skipped).
source "$(dirname "$0")/common.sh"
LIMIT=$((1024 * 1024 * 1024))
GROUP=""
EVENTS=""

remove_group() {
  local rc=$?
  if [ -n "$GROUP" ] && [ -d "$GROUP" ]; then
    # Nothing of ours may outlive the test in it; then it can go.
    for pid in $(cat "$GROUP/cgroup.procs" 2>/dev/null); do
      kill -9 "$pid" 2>/dev/null || true
    done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      rmdir "$GROUP" 2>/dev/null && break
      sleep 0.5
    done
  fi
  return "$rc"
}
trap 'remove_group; remove_work_if_passed' EXIT

# A fresh group with LIMIT bytes: sets GROUP (its folder), EVENTS (the
# file that counts its OOM kills) and KIND; returns 1 with WHY set.
make_group() {
  local name="memtrain_e2e_$$" root own
  for root in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    [ -f "$root/cgroup.controllers" ] || continue
    grep -qw memory "$root/cgroup.controllers" || continue
    grep -qw memory "$root/cgroup.subtree_control" ||
      echo +memory >"$root/cgroup.subtree_control" 2>/dev/null || continue
    mkdir "$root/$name" 2>/dev/null || continue
    GROUP="$root/$name"
    if echo "$LIMIT" >"$GROUP/memory.max" 2>/dev/null; then
      echo 0 >"$GROUP/memory.swap.max" 2>/dev/null || true
      EVENTS="$GROUP/memory.events"
      KIND="cgroup v2 memory.max"
      return 0
    fi
    rmdir "$GROUP"
    GROUP=""
  done
  own=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
  root=/sys/fs/cgroup/memory${own%/}
  if [ -n "$own" ] && [ -f "$root/memory.limit_in_bytes" ] &&
    mkdir "$root/$name" 2>/dev/null; then
    GROUP="$root/$name"
    if echo "$LIMIT" >"$GROUP/memory.limit_in_bytes" 2>/dev/null; then
      EVENTS="$GROUP/memory.oom_control"
      KIND="cgroup v1 memory.limit_in_bytes"
      return 0
    fi
  fi
  WHY="no writable memory cgroup: cgroup v2 without the memory controller"
  WHY+=" at /sys/fs/cgroup or /sys/fs/cgroup/unified, and no cgroup v1 memory"
  WHY+=" hierarchy at /sys/fs/cgroup/memory${own:-} (needs root)"
  return 1
}

if ! make_group; then
  echo "SKIP (machine): $WHY"
  exit 77
fi
if [ "$(awk '/SwapTotal/ {print $2}' /proc/meminfo)" != 0 ] &&
  [ "$KIND" = "cgroup v1 memory.limit_in_bytes" ]; then
  # v1 without memsw would let the job swap instead of being killed.
  echo $LIMIT >"$GROUP/memory.memsw.limit_in_bytes" 2>/dev/null ||
    fail "this machine has swap and $GROUP has no memory.memsw.limit_in_bytes"
fi
echo "limit: $KIND = $LIMIT bytes at $GROUP"
oom_kills() {  # the group's OOM kills so far (0 where the kernel does not count them)
  awk '$1 == "oom_kill" {n = $2} END {print n + 0}' "$EVENTS"
}
# Kernels before 4.13 have no oom_kill line in v1's memory.oom_control: the
# exit status alone must show the kill there.
COUNTS_KILLS=1
grep -q '^oom_kill ' "$EVENTS" || COUNTS_KILLS=0
peak_usage() {  # the group's peak since it was made (MiB), where it says
  local f
  for f in memory.max_usage_in_bytes memory.peak; do
    [ -f "$GROUP/$f" ] && { echo "$(($(cat "$GROUP/$f") >> 20)) MiB"; return; }
  done
  echo "not reported"
}

"$MEMTRAIN" make-data --kind volumes --out train.h5 --samples 16 --channels 1 \
  --depth 32 --height 32 --width 32 --classes 3 --noise 0.7 --chunk 16 >/dev/null
JOB=(train --data.train=train.h5 --data.val= --model.name=unet3d
  --data.patch_size=32 --data.patches_per_volume=8 --training.epochs=1
  --training.effective_batch_size=64 --data.batch_size=auto
  --training.gradient_checkpointing=auto --memory.budget=v100-16gb)
in_group() {  # NAME ARGS...: the job inside the group; NAME.log, NAME/
  local name=$1
  shift
  timeout 240 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$GROUP" \
    "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" "${JOB[@]}" --output.dir="$name" \
    "$@" >"$name.log" 2>&1
}

# 1. A host budget above the limit: killed by the kernel.
before=$(oom_kills)
rc=0
in_group over --memory.host_budget=16GiB || rc=$?
kills=$(($(oom_kills) - before))
echo "host budget 16GiB inside the limit: exit status $rc, OOM kills $kills, group's peak $(peak_usage)"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { tail -20 over.log; fail "not killed (exit $rc)"; }
[ "$kills" -gt 0 ] || [ "$COUNTS_KILLS" = 0 ] ||
  { tail -20 over.log; fail "exit $rc without an OOM kill in $EVENTS"; }

# 2. The default host budget: inside the limit, the same losses.
before=$(oom_kills)
rc=0
in_group fits || rc=$?
[ "$rc" = 0 ] || { tail -30 fits.log; fail "the job with memory.host_budget=auto: exit $rc"; }
[ "$(($(oom_kills) - before))" = 0 ] || fail "an OOM kill in the group during the fitting job"
grep -E "^(memory|host) plan" fits.log || fail "no plan in fits.log"
# job_memory names v1's limit "cgroup (v1) memory.limit_in_bytes of ...",
# v2's "cgroup memory.max of ...".
grep -q "^host plan: .*(cgroup \((v1) \)\?memory\.\(max\|limit_in_bytes\) of " fits.log ||
  fail "the host plan does not name the cgroup's limit"
# The same job without a limit at the micro-batch the limit led to:
# equal losses (checkpointing changes no gradient bit).
micro=$("$PY" -c "import json; print(json.load(open('fits/memory_plan.json'))['micro_batch'])")
timeout 240 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" "${JOB[@]}" --output.dir=same --data.batch_size="$micro" \
  --training.gradient_checkpointing=off >same.log 2>&1 ||
  { tail -20 same.log; fail "the job without a limit at micro-batch $micro"; }
"$PY" - <<'PYEOF' || fail "losses differ from the job without a limit"
import json
def windows(d):
    return [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"window"' in l]
fits, same = windows("fits"), windows("same")
plan = json.load(open("fits/memory_plan.json"))
assert len(fits) == len(same) == 2, (len(fits), len(same))
assert [w["loss"] for w in fits] == [w["loss"] for w in same], (fits, same)
print(f"inside the limit: micro-batch {plan['micro_batch']}, checkpointed "
      f"{plan['checkpointed_segments']}; window losses {[w['loss'] for w in fits]}, "
      f"equal to the unlimited job's at that micro-batch; largest rank RSS at a "
      f"boundary {max(w['host_rss'] for w in fits) / 2**20:.0f} MiB")
PYEOF
