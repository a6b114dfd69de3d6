# Sourced by the e2e scripts: arguments and helpers.
# Usage of a script: SCRIPT MEMTRAIN MPIEXEC PYTHON WORKDIR MAKE_BAD_H5
set -euo pipefail
MEMTRAIN=$1
MPIEXEC=$2
PY=$3
WORK=$4
MAKE_BAD_H5=${5:-}
TOOLS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)
export TOOLS
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"

# mpirun with what a container as root needs; -np given by the caller.
mpi() {
  "$MPIEXEC" --oversubscribe "$@"
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
