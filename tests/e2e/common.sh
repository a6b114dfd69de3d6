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
