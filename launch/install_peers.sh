#!/usr/bin/env bash
# Installs the independent readers the tests check memtrain's outputs with,
# from PyPI into a venv: TensorBoard's Python package (tests/tools/read_tb.py
# reads output.dir/tb with it), nibabel and h5py (tests/corpus: the damaged
# NIfTI and HDF5 inputs are built and the outputs read with them). Does
# nothing when the venv already has them all, at these versions; prints one
# line when it installs.
#   MEMTRAIN_PEERS_VENV   where (default /opt/memtrain/peers-venv)
set -euo pipefail
venv=${MEMTRAIN_PEERS_VENV:-/opt/memtrain/peers-venv}
# Debian's interpreter (install_deps.sh installs python3 and python3-venv).
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)

packages=("tensorboard==2.21.0" "nibabel==5.4.2" "h5py==3.16.0" "numpy==2.4.6")

installed() {
  [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" - "${packages[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import tensorboard.backend.event_processing.event_accumulator, nibabel, h5py, numpy
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PY
}
installed && exit 0

echo "install_peers.sh: installing ${packages[*]} into $venv"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
  { echo "install_peers.sh: no python3-venv (bash launch/install_deps.sh)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}"
installed || { echo "install_peers.sh: ${packages[*]} do not import from $venv" >&2; exit 1; }
