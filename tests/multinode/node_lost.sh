#!/usr/bin/env bash
# A node lost during a run across two hosts (tests/multinode/cluster.sh:
# node1 and node2, 2 ranks each; mpirun started on node1, as on a cluster's
# first node; checkpoints in the nodes' shared folder):
# (a) node2 crashes: every process on it is killed (its sockets close):
#     mpirun names the node and ends the job, status 1;
# (b) node2 is cut off (its link down, no process dies): rank 0 names
#     "ranks 2, 3 on node2" within dist.timeout_s and the job ends with
#     status 1; mpirun itself ends when TCP gives up on node2's daemon
#     (net.ipv4.tcp_retries2, 6 on these nodes: about 25 s);
# after each, the newest checkpoint is whole (`memtrain export` verifies
# its checksum), no process of the run is left on either node, and the run
# resumes on node1 alone at world size 2 (--resume auto, the same
# effective batch): its window losses are those of the
# uninterrupted run within 1e-5 relative, its final weights within 1e-4
# (224 windows summed in another order).
# usage: node_lost.sh MEMTRAIN MPIEXEC PYTHON WORKDIR; exit 77 (skipped,
# the reason printed) where namespaces cannot be made (not root).
set -uo pipefail
MEMTRAIN=$1
MPIEXEC=$2
PY=$3
WORK=$4
source "$(dirname "$0")/common.sh"
start_cluster 2
on() { # NODE COMMAND...: run on a node, unpinned (its ranks pin themselves)
  local node=$1
  shift
  MT_PIN=0 bash "$C/cluster.sh" exec "$C" "$node" "$@"
}

source "$HERE/lost_run.sh"
lost_run_setup "$S"

# A 2 x 2 run into OUT, started on node1; HOW (kill or link) strikes node2
# once a checkpoint at step 32 or later is on disk. Sets lost_rc, t_line
# (seconds from the strike to rank 0's line, or -1) and t_end (to mpirun's
# end).
lose_node2() {
  local out=$1 how=$2
  on node1 "$MPIEXEC" "${MT_MPI_ARGS[@]}" --hostfile "$MT_HOSTFILE" --oversubscribe \
    --map-by ppr:2:node -np 4 "$MEMTRAIN" train --config "$S/cfg.yaml" --output.dir="$S/$out" \
    >"$out.log" 2>&1 &
  local pid=$!
  local waited=0
  until ls "$S/$out/checkpoints/" 2>/dev/null | grep -q 'ckpt-000000\([3-9][0-9]\|[1-9][0-9][0-9]\)\.'; do
    kill -0 $pid 2>/dev/null || { tail -20 "$out.log"; fail "$how: the run ended before its checkpoint at step 32"; }
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 1200 ] || fail "$how: no checkpoint at step 32 after 120 s"
  done
  local t0
  t0=$(date +%s.%N)
  if [ "$how" = kill ]; then
    bash "$C/cluster.sh" kill "$C" node2
  else
    bash "$C/cluster.sh" link "$C" node2 down
  fi
  t_line=-1
  while kill -0 $pid 2>/dev/null; do
    if [ "$t_line" = -1 ] && grep -q "^memtrain: \[rank 0, node1\] error: .* did not arrive" "$out.log"; then
      t_line=$(echo "$(date +%s.%N) - $t0" | bc)
    fi
    sleep 0.1
    [ "$(echo "$(date +%s.%N) - $t0 > 240" | bc)" = 1 ] && { kill -INT $pid; fail "$how: mpirun still running 240 s after node2 was lost"; }
  done
  wait $pid
  lost_rc=$?
  t_end=$(echo "$(date +%s.%N) - $t0" | bc)
}

# (a) node2 crashes.
lose_node2 crash kill
grep -v '"type"' crash.log | grep -i "node2\|lost\|error" | head -8
[ "$lost_rc" != 0 ] || fail "kill: mpirun exited 0"
grep -q "node2" crash.log || fail "kill: no line names node2"
echo "kill: mpirun ended $t_end s after node2's processes were killed, status $lost_rc"
none_left node1
none_left node2
newest_whole "$S/crash"

# (b) node2 cut off.
lose_node2 cut link
grep -h "error:" cut.log | head -4
[ "$lost_rc" = 1 ] || fail "link: mpirun exited $lost_rc, not 1"
line=$(grep "^memtrain: \[rank 0, node1\] error:" cut.log)
[[ "$line" == *"ranks 2, 3 on node2 did not arrive"* ]] || fail "link: rank 0's line does not name ranks 2, 3 on node2: $line"
[ "$t_line" != -1 ] && [ "$(echo "$t_line <= 10 + 15" | bc)" = 1 ] ||
  fail "link: rank 0's line came $t_line s after the cut (dist.timeout_s=10)"
echo "link: rank 0 named ranks 2, 3 on node2 $t_line s after the cut; mpirun ended after $t_end s, status $lost_rc"
bash "$C/cluster.sh" link "$C" node2 up
none_left node1
none_left node2
newest_whole "$S/cut"

# The cut run resumes on node1 alone: 2 ranks, the same effective batch.
on node1 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --config "$S/cfg.yaml" \
  --output.dir="$S/cut" --resume auto >resume.log 2>&1 || { tail -20 resume.log; fail "resume on node1"; }
grep "resumed from" resume.log || fail "no resume line"
grep -q "on 1 node × 2 ranks" resume.log || { head -3 resume.log; fail "the resumed run is not 1 node x 2 ranks"; }
"$PY" - "$S" "$REPO/tests/tools" "$REPO/tests/peers" <<'PYEOF' || fail "the resumed run's losses or weights"
import sys
sys.path[:0] = sys.argv[2:4]
import check_metrics
import safetensors_read
S = sys.argv[1]
loss = check_metrics.same_losses(f"{S}/full", f"{S}/cut", 256, 1e-5)
wa, _ = safetensors_read.load(f"{S}/full/model.safetensors")
wb, _ = safetensors_read.load(f"{S}/cut/model.safetensors")
worst = safetensors_read.max_relative_diff(wa, wb)
assert worst <= 1e-4, worst
print(f"resumed on node1 at world size 2: 256 windows, losses within {loss:.2g} and "
      f"weights within {worst:.2g} relative of the uninterrupted run")
PYEOF
none_left node1

stop_cluster
echo "PASS node_lost"
