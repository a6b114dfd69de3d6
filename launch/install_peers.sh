#!/usr/bin/env bash
# Installs the independent readers the tests check memtrain's outputs with,
# from PyPI into a venv: TensorBoard's Python package (tests/peers/read_tb.py
# reads output.dir/tb with it), nibabel and h5py (tests/corpus: the damaged
# NIfTI and HDF5 inputs are built and the outputs read with them). Does
# nothing when the venv already has them all, at these versions; prints one
# line when it installs.
# MONAI (tests/e2e/monai_validation.sh: its sliding window and DiceMetric
# are the reference whole-volume validation is checked against) and
# open_clip (its CLIP towers, logits and tokenizer are the references
# model.name=clip and convert-captions are checked against) need torch
# >= 2.8, which Debian's python3-torch (1.13) is not: it goes into the torch
# venv (launch/install_torch.sh, torch 2.11, the GPU nodes' version, which
# the CUDA configuration installs anyway) with numpy and h5py, rather than a
# second 4.6 GB copy of torch here.
#   MEMTRAIN_PEERS_VENV   where (default /opt/memtrain/peers-venv)
#   MEMTRAIN_TORCH_VENV   the torch venv MONAI joins (default
#                         /opt/memtrain/torch-venv)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
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
monai() {  # MONAI and open_clip with what they read, into the torch venv
  local tv=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}
  local want=("monai==1.6.1" "einops==0.8.2" "numpy==2.4.6" "h5py==3.16.0"
    "open_clip_torch==3.3.0" "torchvision==0.26.0" "ftfy==6.3.1"
    "regex==2026.11.19" "timm==1.0.31")
  have() {
    "$tv/bin/python" - "${want[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import monai.inferers, monai.metrics, einops, h5py, numpy, torch, open_clip
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PY
  }
  have && return 0
  bash "$here/install_torch.sh"
  echo "install_peers.sh: installing ${want[*]} into $tv"
  "$tv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
  have || { echo "install_peers.sh: ${want[*]} do not import from $tv" >&2; exit 1; }
}

if installed; then
  monai
  exit 0
fi

echo "install_peers.sh: installing ${packages[*]} into $venv"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
  { echo "install_peers.sh: no python3-venv (bash launch/install_deps.sh)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}"
installed || { echo "install_peers.sh: ${packages[*]} do not import from $venv" >&2; exit 1; }
monai
