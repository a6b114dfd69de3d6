#!/usr/bin/env bash
# Local launch: N ranks of `memtrain train` on this machine via mpirun.
# usage: launch/run.sh [-np N] [memtrain train arguments ...]
#   launch/run.sh -np 2 --config launch/configs/features.yaml
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
np=2
if [ "${1:-}" = "-np" ]; then
  [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] ||
    { echo "usage: $0 [-np N] [memtrain train args...]" >&2; exit 2; }
  np=$2
  shift 2
fi
binary=${MEMTRAIN_BIN:-$here/../build/memtrain}
[ -x "$binary" ] || { echo "run.sh: $binary not built (bash launch/build.sh)" >&2; exit 2; }
source "$here/env.sh"
# Each rank bound to its share of the CPUs (env.sh, memtrain_binding).
memtrain_binding "$np"
exec mpirun -np "$np" "${MEMTRAIN_BINDING[@]}" "$binary" train "$@"
