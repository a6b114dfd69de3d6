#!/usr/bin/env bash
# Installs what memtrain needs from Debian's packages (bookworm), as root.
# Installs only what is missing; prints what it installs.
set -euo pipefail
packages=(
  build-essential cmake ccache pkg-config    # toolchain; ccache for rebuilds
  libtorch-dev                               # LibTorch 1.13 (CPU)
  libopenblas0-pthread                       # optimised BLAS behind LibTorch's
                                             # fp32 matmuls (libblas.so.3)
  libopenmpi-dev openmpi-bin                 # MPI: ranks and host collectives
  libhdf5-dev                                # HDF5 C API: datasets
  libyaml-cpp-dev                            # YAML configs
  libcli11-dev                               # command line
  nlohmann-json3-dev                         # metrics.jsonl, safetensors header,
                                             # convert-dataset's dataset.json and
                                             # splits_final.json
  libnifti2-dev                              # NIfTI-1 and NIfTI-2 reading (nifti2_io),
                                             # writing: convert-nifti, convert-dataset,
                                             # predict
  mricron-data                               # MNI templates: the brain dataset
  libgtest-dev                               # tests
  python3                                    # e2e checks (standard library only)
  python3-torch python3-h5py                 # benchmarks/vs_pytorch: the PyTorch DDP side
                                             # (Debian's LibTorch 1.13, as the CPU build's)
  gnuplot-nox                                # PNG plots: output.dir/progress.png,
                                             # memtrain plot, the benchmarks
  libpng-dev                                 # validation overlays (output.dir/val),
                                             # PNG decoding: convert-images
  libjpeg-dev                                # JPEG decoding (libjpeg-turbo):
                                             # convert-images
  libicu-dev                                 # Unicode for the CLIP tokenizer
                                             # (NFC/NFKC, lowercasing, letter and
                                             # number classes): convert-captions
  zlib1g-dev                                 # reading .gz files: the CLIP BPE
                                             # vocabulary (convert-captions), NIfTI
  python3-pil                                # e2e convert_images: PIL's decode
                                             # + resize to compare with
  python3-nibabel python3-scipy              # e2e predict: nibabel reads the NIfTI
                                             # outputs, scipy's EDT checks HD95
  python3-venv                               # install_peers.sh's venv (tensorboard)
  iproute2                                   # ip, tc: the emulated nodes of the
                                             # multi-node tests (tests/multinode)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "install_deps.sh: run as root (apt-get)" >&2; exit 1; }
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
