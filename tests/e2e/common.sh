# Sourced by the e2e scripts: arguments and helpers.
# Usage of a script: SCRIPT MEMTRAIN MPIEXEC PYTHON WORKDIR MAKE_BAD_H5
set -euo pipefail
MEMTRAIN=$1
MPIEXEC=$2
PY=$3
WORK=$4
MAKE_BAD_H5=${5:-}
TOOLS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)
# The peers' reference scripts and independent readers (tests/peers/).
PEER_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../peers" && pwd)
export TOOLS PEER_SCRIPTS
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
# A passing script leaves no files behind (some write 2 GB of resnet50
# checkpoints, and CI's disk is shared); a failing one keeps them to look
# at, as does MEMTRAIN_KEEP_E2E=1.
remove_work_if_passed() {
  local rc=$?
  if [ "$rc" = 0 ] && [ "${MEMTRAIN_KEEP_E2E:-0}" != 1 ]; then
    cd / && rm -rf "$WORK"
  fi
  return "$rc"
}
trap remove_work_if_passed EXIT

# mpirun with what a container as root needs; -np given by the caller.
mpi() {
  "$MPIEXEC" --oversubscribe "$@"
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# `memtrain train` on NP ranks with the script's array `common` (set it
# first) and ARGS, into output.dir=NAME, its output in NAME.log; a failure
# prints the log's tail.
train_common() {  # NP NAME ARGS...
  local np=$1 name=$2 rc=0
  shift 2
  timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$MEMTRAIN" train "${common[@]}" \
    --output.dir="$name" "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { tail -30 "$name.log"; fail "$name: exit status $rc"; }
}

# `memtrain train` with `common` and ARGS must stop at once with exit
# status 2 and a line holding PATTERN (a fixed string).
refused_common() {  # NAME PATTERN ARGS...
  local name=$1 pattern=$2 rc=0
  shift 2
  "$MEMTRAIN" train "${common[@]}" --output.dir="r_$name" --training.max_windows=1 "$@" \
    >"r_$name.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "r_$name.log"; fail "$name: exit status $rc, not 2"; }
  grep -qF -- "$pattern" "r_$name.log" || { cat "r_$name.log"; fail "$name: no '$pattern'"; }
}
