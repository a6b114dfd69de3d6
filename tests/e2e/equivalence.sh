#!/usr/bin/env bash
# DESIGN.md semantics 1 through the executable: one window of
# 1 rank x 4 micro-steps x 2, 2 ranks x 2 x 2 and 1 rank x 1 x 8 gives the
# same model.safetensors (max abs difference < 1e-5), read back by an
# independent safetensors reader; and the update is not trivially zero.
# output.save_initial: initial.safetensors is the same for the same
# model.seed and is what the first window started from.
source "$(dirname "$0")/common.sh"

"$MEMTRAIN" make-data --kind features --out train.h5 --samples 64 --seed 3
run() {  # NAME NP MICRO ACCUM [extra]
  mpi -np "$2" "$MEMTRAIN" train --data.train=train.h5 --data.val= \
    --data.batch_size="$3" --training.gradient_accumulation_steps="$4" \
    --training.max_windows=1 --training.lr=1.0 --training.momentum=0 \
    --output.dir="$1" "${@:5}" >"$1.log" 2>&1 || { cat "$1.log"; fail "$1"; }
}
run a 1 2 4
run b 2 2 2
run c 1 8 1 --output.save_initial=true
run z 1 8 1 --training.lr=1e-12 --output.save_initial=true
ab=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" a/model.safetensors b/model.safetensors)
ac=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" a/model.safetensors c/model.safetensors)
cz=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" c/model.safetensors z/model.safetensors)
echo "max |a-b| = $ab, max |a-c| = $ac, update size max |c-z| = $cz"
"$PY" -c "import sys; a,b,u=map(float,sys.argv[1:]); sys.exit(0 if a<1e-5 and b<1e-5 and u>1e-2 else 1)" \
  "$ab" "$ac" "$cz" || fail "updates differ"
[ ! -e a/initial.safetensors ] || fail "initial.safetensors written without output.save_initial"
ii=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" c/initial.safetensors z/initial.safetensors)
iz=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" c/initial.safetensors z/model.safetensors)
ic=$("$PY" "$PEER_SCRIPTS/safetensors_read.py" c/initial.safetensors c/model.safetensors)
echo "initial: max |c0-z0| = $ii, max |c0-z1| = $iz (lr 1e-12), max |c0-c1| = $ic"
"$PY" -c "import sys; a,b,u=map(float,sys.argv[1:]); sys.exit(0 if a==0 and b<1e-6 and u>1e-2 else 1)" \
  "$ii" "$iz" "$ic" || fail "initial.safetensors is not the starting point"
echo "e2e equivalence: ok"
