#!/usr/bin/env bash
# Installs the PyPI wheel torch==2.11.0 (LibTorch 2.11 built for CUDA 13.0)
# and the NVIDIA libraries it loads (cudart, cuBLAS, cuDNN, NCCL, cuSPARSELt,
# NVSHMEM, ...) into a venv, for the CUDA build (-DMEMTRAIN_CUDA=ON, see
# README "Build notes"). Does nothing when the venv already has it; prints one
# line when it installs.
#   MEMTRAIN_TORCH_VENV   where (default /opt/memtrain/torch-venv)
#   PIP_FIND_LINKS        a folder with already downloaded wheels (pip's own)
set -euo pipefail
venv=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}
version=2.11.0
# Debian's interpreter (install_deps.sh installs python3): the one python3-venv
# completes, and not whatever a version manager puts first on PATH.
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)

installed() {
  [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" - "$version" 2>/dev/null <<'EOF'
import sys, torch
sys.exit(torch.__version__.split("+")[0] != sys.argv[1])
EOF
}
installed && exit 0

echo "install_torch.sh: installing torch==$version with its CUDA 13 libraries into $venv"
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "install_torch.sh: needs python3-venv (run as root)" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$version"
installed || { echo "install_torch.sh: torch $version does not import from $venv" >&2; exit 1; }
