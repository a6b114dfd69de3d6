#!/usr/bin/env bash
# Installs the independent readers the tests check memtrain's outputs with:
# TensorBoard's Python package (tests/tools/read_tb.py reads output.dir/tb
# with it), from PyPI into a venv. Does nothing when the venv already has it;
# prints one line when it installs.
#   MEMTRAIN_PEERS_VENV   where (default /opt/memtrain/peers-venv)
set -euo pipefail
venv=${MEMTRAIN_PEERS_VENV:-/opt/memtrain/peers-venv}
# Debian's interpreter (install_deps.sh installs python3 and python3-venv).
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)

installed() {
  [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" -c 'import tensorboard.backend.event_processing.event_accumulator' 2>/dev/null
}
installed && exit 0

echo "install_peers.sh: installing tensorboard into $venv"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
  { echo "install_peers.sh: no python3-venv (bash launch/install_deps.sh)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "tensorboard==2.21.0"
installed || { echo "install_peers.sh: tensorboard does not import from $venv" >&2; exit 1; }
