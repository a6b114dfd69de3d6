#!/usr/bin/env bash
# A rank stuck before a start-up collective ends the job after
# dist.timeout_s, with rank 0 naming it; nothing hangs. The stuck rank
# blocks opening its rank log, made a FIFO that nobody reads (as an open on
# a hung file system blocks): cmd_train opens output.dir/rank-N.log in an
# agreed() step, so its peers wait for it in Environment::all_ok.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out small.h5 --samples 64
A="--data.train=small.h5 --data.val= --training.epochs=1 --dist.timeout_s=3"
for case in "2 1" "4 2"; do
  read -r np stuck <<<"$case"
  out=stuck_np$np
  mkdir -p $out
  mkfifo $out/rank-$stuck.log
  start=$SECONDS
  rc=0
  timeout 120 "$MPIEXEC" --oversubscribe -np $np "$MEMTRAIN" train $A \
    --output.dir=$out >$out.log 2>&1 || rc=$?
  took=$((SECONDS - start))
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat $out.log; fail "np $np: exit $rc (124: it hung)"; }
  [ "$took" -ge 3 ] || { cat $out.log; fail "np $np: ended after ${took}s, before the 3 s timeout"; }
  [ "$took" -lt 60 ] || { cat $out.log; fail "np $np: the job took ${took}s to end"; }
  grep -q "start-up check #[0-9]* did not complete within dist.timeout_s=3 s: rank $stuck on [^ ]* did not arrive" $out.log ||
    { cat $out.log; fail "np $np: rank 0 did not name rank $stuck alone"; }
  [ ! -e $out/model.safetensors ] || fail "np $np: a model was written"
  echo "np $np: rank $stuck stuck opening its log; job ended with exit $rc after ${took}s, rank 0 named rank $stuck"
done
echo "e2e startup_timeout: ok"
