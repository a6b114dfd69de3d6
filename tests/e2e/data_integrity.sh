#!/usr/bin/env bash
# Checksummed data (Note [Checksummed data]), through the executable:
# 1. make-data's file verifies: `inspect --verify` exits 0, one line.
# 2. Two 512-byte blocks of random bytes written by dd into a chunk of
#    /features: `inspect --verify` lists exactly that chunk and exits 2;
#    `mpirun -np 2 memtrain train` on it exits non-zero within seconds (no
#    hang) with a message naming the file, the dataset, the rows and what
#    to do, and no HDF5 error stack.
# 3. A file without checksums (another tool's) cannot be verified (exit 1)
#    and trains, with exactly one "cannot be verified" line.
source "$(dirname "$0")/common.sh"

# 1. 4096 x 32 float32: /features in 2 chunks of 2048 rows, /labels in 1.
"$MEMTRAIN" make-data --kind features --out good.h5 --samples 4096 >/dev/null
"$MEMTRAIN" inspect --verify good.h5 >verify.txt || { cat verify.txt; fail "verify good.h5"; }
[ "$(cat verify.txt)" = "all 3 chunks of 2 datasets verified" ] || { cat verify.txt; fail "verify good.h5: text"; }
echo "good.h5: $(cat verify.txt)"

# 2. Damage chunk 1 of /features (rows 2048-4095).
cp good.h5 bad.h5
read -r off size < <("$MAKE_BAD_H5" chunk-offset bad.h5 features 1)
[ "$size" -gt 4096 ] || fail "chunk 1 of /features: $size bytes"
dd if=/dev/urandom of=bad.h5 bs=512 seek=$((off / 512 + 2)) count=2 conv=notrunc status=none
rc=0
"$MEMTRAIN" inspect --verify bad.h5 >verify.txt || rc=$?
[ "$rc" = 2 ] || { cat verify.txt; fail "verify bad.h5: exit $rc, want 2"; }
[ "$(grep -c '^damaged:' verify.txt)" = 1 ] || { cat verify.txt; fail "verify bad.h5: want one damaged chunk"; }
grep -qF "damaged: '/features' chunk 1 of 2 at [2048, 0] (rows 2048-4095; $size bytes at file offset $off): checksum mismatch" verify.txt ||
  { cat verify.txt; fail "verify bad.h5: wrong chunk"; }
echo "bad.h5: exit $rc; $(grep '^damaged:' verify.txt)"

start=$SECONDS
rc=0
timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --data.train=bad.h5 --data.val= \
  --data.batch_size=64 --training.epochs=1 --output.dir=bad >bad.log 2>&1 || rc=$?
took=$((SECONDS - start))
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat bad.log; fail "train bad.h5: exit $rc"; }
[ "$took" -lt 60 ] || fail "train bad.h5: took ${took}s"
grep -E "error: 'bad.h5' dataset '/features' rows [0-9]" bad.log | head -1 >msg.txt
[ -s msg.txt ] || { cat bad.log; fail "train bad.h5: no message naming file, dataset, rows"; }
for p in "the file is damaged (checksum mismatch" "Re-create it" "restore it from a copy" \
  "\`memtrain inspect --verify bad.h5\` lists the damaged chunks"; do
  grep -qF -- "$p" msg.txt || { cat bad.log; fail "train bad.h5: no '$p'"; }
done
! grep -q "HDF5-DIAG\|H5Dread" bad.log || { cat bad.log; fail "train bad.h5: HDF5 error stack printed"; }
echo "train bad.h5 (2 ranks): exit $rc after ${took}s; $(cut -c1-160 msg.txt)..."

# 3. No checksums (contiguous, no filter: as other tools write).
"$MAKE_BAD_H5" no-checksum raw.h5
rc=0
"$MEMTRAIN" inspect --verify raw.h5 >verify.txt || rc=$?
[ "$rc" = 1 ] || { cat verify.txt; fail "verify raw.h5: exit $rc, want 1"; }
grep -qF "cannot be verified: /features, /labels" verify.txt || { cat verify.txt; fail "verify raw.h5: text"; }
echo "raw.h5: exit $rc; $(cut -c1-100 verify.txt)..."
mpi -np 2 "$MEMTRAIN" train --data.train=raw.h5 --data.val=raw.h5 --data.batch_size=16 \
  --training.epochs=1 --output.dir=raw >raw.log 2>&1 || { cat raw.log; fail "train raw.h5"; }
for role in data.train data.val; do
  n=$(grep -c "warning: $role: 'raw.h5' cannot be verified" raw.log || true)
  [ "$n" = 1 ] || { cat raw.log; fail "train raw.h5: $n '$role ... cannot be verified' lines, want 1"; }
done
[ "$(grep -c "cannot be verified" raw.log)" = 2 ] || { cat raw.log; fail "train raw.h5: extra lines"; }
echo "train raw.h5 (2 ranks): ok; $(grep -m1 'cannot be verified' raw.log | cut -c1-120)..."
echo "e2e data_integrity: ok"
