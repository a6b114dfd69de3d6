#!/usr/bin/env bash
# Each bad input ends every rank count (1, 2, 4) with exit status 2, one
# error line naming the file and the dataset (or the config key), quickly,
# and before any training output.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out good.h5 --samples 64
echo "this is not HDF5" >text.h5
for c in wrong-rank wrong-dtype length-mismatch empty; do
  "$MAKE_BAD_H5" "$c" "$c.h5"
done

expect_error() {  # NP PATTERN ARGS...
  local np=$1 pattern=$2
  shift 2
  local start=$SECONDS rc=0
  timeout 120 "$MPIEXEC" --oversubscribe -np "$np" "$MEMTRAIN" train \
    --data.val= --output.dir=out "$@" >out.txt 2>err.txt || rc=$?
  local took=$((SECONDS - start))
  [ "$rc" = 2 ] || { cat out.txt err.txt; fail "np=$np $*: exit $rc, want 2"; }
  local n
  n=$(grep -c "memtrain: error:" err.txt || true)
  [ "$n" = 1 ] || { cat err.txt; fail "np=$np $*: $n error lines, want 1"; }
  grep -q -- "$pattern" err.txt || { cat err.txt; fail "np=$np $*: no '$pattern'"; }
  ! grep -q "window" out.txt || fail "np=$np $*: training started"
  echo "np=$np ${took}s: $(grep 'memtrain: error:' err.txt)"
}

for np in 1 2 4; do
  expect_error $np "data.train: 'missing.h5': no such file" --data.train=missing.h5
  expect_error $np "'text.h5': not an HDF5 file" --data.train=text.h5
  expect_error $np "'wrong-rank.h5' dataset '/features': expected 2-D" --data.train=wrong-rank.h5
  expect_error $np "'wrong-dtype.h5' dataset '/labels': expected integer labels" --data.train=wrong-dtype.h5
  expect_error $np "'length-mismatch.h5' dataset '/labels': has 60 labels but '/features' has 64" --data.train=length-mismatch.h5
  expect_error $np "'empty.h5' dataset '/features': is empty" --data.train=empty.h5
  expect_error $np "data.val: 'text.h5': not an HDF5 file" --data.train=good.h5 --data.val=text.h5
  expect_error $np "unknown key 'training.lrr'" --data.train=good.h5 --training.lrr=0.1
  expect_error $np "data.batch_size = '0' (command line): out of range" --data.train=good.h5 --data.batch_size=0
  expect_error $np "model.name=cnn cannot train on features (data.train 'good.h5')" --data.train=good.h5 --model.name=cnn
  expect_error $np "is too small for the model itself" --data.train=good.h5 --memory.budget=1KiB
  expect_error $np "memory.budget = 'lots'" --data.train=good.h5 --memory.budget=lots
  # A device the build or machine lacks is refused by name before any data
  # is read (data.train does not even exist here).
  expect_error $np "dist.device=cuda, but " --data.train=missing.h5 --dist.device=cuda
  expect_error $np "dist.backend=nccl reduces CUDA tensors" --data.train=good.h5 --dist.device=cpu --dist.backend=nccl
done
# A bad flag is a usage error too.
rc=0; "$MEMTRAIN" train --bogus >/dev/null 2>err.txt || rc=$?
[ "$rc" = 2 ] || fail "bad flag: exit $rc"
echo "e2e bad_inputs: ok"
