#!/usr/bin/env bash
# The damaged-input corpus (issue 35, point 7): tests/corpus/damaged_inputs.py
# run against the memtrain executable with the peers venv's Python (nibabel,
# h5py, numpy: launch/install_peers.sh).
# Usage: damaged_inputs.sh MEMTRAIN WORKDIR [damaged_inputs.py options...]
# The work folder is removed when every case passes (MEMTRAIN_KEEP_E2E=1
# keeps it), kept to look at when one fails.
set -euo pipefail
MEMTRAIN=$1
WORK=$2
shift 2
PEERS=${MEMTRAIN_PEERS_VENV:-/opt/memtrain/peers-venv}/bin/python
"$PEERS" -c 'import nibabel, h5py, numpy' 2>/dev/null || {
  echo "FAIL: no nibabel and h5py in $PEERS: bash launch/install_peers.sh" >&2
  exit 1
}
keep=()
[ "${MEMTRAIN_KEEP_E2E:-0}" = 1 ] && keep=(--keep)
exec "$PEERS" "$(dirname "$0")/damaged_inputs.py" --memtrain "$MEMTRAIN" \
  --work "$WORK" "${keep[@]}" "$@"
