#!/usr/bin/env bash
# Configures and builds memtrain into ./build.
# usage: launch/build.sh [--target NAME] [cmake configure arguments ...]
#   launch/build.sh                     everything (tests, benchmarks)
#   launch/build.sh --target memtrain   the executable only
#   launch/build.sh -DMEMTRAIN_CUDA=ON  the CUDA/NCCL build
set -euo pipefail
cd "$(dirname "$0")/.."
target=()
if [ "${1:-}" = "--target" ]; then
  [ $# -ge 2 ] || { echo "usage: $0 [--target NAME] [cmake args...]" >&2; exit 2; }
  target=(--target "$2")
  shift 2
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j"$(nproc)" "${target[@]}"
