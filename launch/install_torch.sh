#!/usr/bin/env bash
# Installs a PyPI torch wheel with the NVIDIA libraries it loads (cudart,
# cuBLAS, cuDNN, NCCL, cuSPARSELt, NVSHMEM, ...) into a venv, for the CUDA
# build (-DMEMTRAIN_CUDA=ON, see docs/build.md). Does nothing when the
# venv already has it; prints one line when it installs.
# usage: launch/install_torch.sh [--cuda 13|12]
#   --cuda 13 (default)  torch==2.11.0, LibTorch 2.11 built for CUDA 13.0
#                        (sm_75 to sm_120: H100, H200, ...), into
#                        $MEMTRAIN_TORCH_VENV (default /opt/memtrain/torch-venv)
#   --cuda 12            torch==2.10.0, LibTorch 2.10 built for CUDA 12.8, the
#                        newest PyPI torch for CUDA 12 and the one for V100
#                        (sm_70 to sm_120), into $MEMTRAIN_TORCH_CU12_VENV
#                        (default /opt/memtrain/torch-venv-cu12); with
#                        nvidia-cuda-nvcc-cu12 (the CUDA 12.8 crt/ headers the
#                        runtime wheel's cuda_runtime.h includes), so a
#                        machine whose toolkit is CUDA 13 compiles against
#                        CUDA 12.8 headers from the venv
#   PIP_FIND_LINKS       a folder with already downloaded wheels (pip's own)
set -euo pipefail
cuda=13
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) [ $# -ge 2 ] || { echo "usage: $0 [--cuda 13|12]" >&2; exit 2; }; cuda=$2; shift 2 ;;
    --cuda=*) cuda=${1#--cuda=}; shift ;;
    *) echo "usage: $0 [--cuda 13|12]" >&2; exit 2 ;;
  esac
done
case "$cuda" in
  13)
    venv=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}
    version=2.11.0
    extra=()
    ;;
  12)
    venv=${MEMTRAIN_TORCH_CU12_VENV:-/opt/memtrain/torch-venv-cu12}
    version=2.10.0
    # The release of nvidia-cuda-runtime-cu12==12.8.90 that torch 2.10.0
    # pins: nvcc's crt/ headers, and CCCL's (nv/target, which cuda_fp16.h
    # includes): without them those come from wherever a CUDA 13 toolkit
    # left its headers on the compiler's default path (/usr/local/include).
    extra=(nvidia-cuda-nvcc-cu12==12.8.93 nvidia-cuda-cccl-cu12==12.8.90)
    ;;
  *) echo "install_torch.sh: --cuda 13 or 12, not $cuda" >&2; exit 2 ;;
esac
# Debian's interpreter (install_deps.sh installs python3): the one python3-venv
# completes, and not whatever a version manager puts first on PATH.
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)

installed() {
  [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" - "$version" "${extra[@]}" 2>/dev/null <<'EOF'
import sys, torch
from importlib import metadata
ok = torch.__version__.split("+")[0] == sys.argv[1]
for req in sys.argv[2:]:
    name, want = req.split("==")
    ok = ok and metadata.version(name) == want
sys.exit(not ok)
EOF
}
installed && exit 0

echo "install_torch.sh: installing torch==$version with its CUDA $cuda libraries${extra[*]:+ and ${extra[*]}} into $venv"
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "install_torch.sh: needs python3-venv (run as root)" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$version" "${extra[@]}"
installed || { echo "install_torch.sh: torch $version${extra[*]:+ and ${extra[*]}} do not import from $venv" >&2; exit 1; }
