#!/usr/bin/env bash
# Configures and builds memtrain into ./build (or $MEMTRAIN_BUILD_DIR).
# usage: launch/build.sh [--build-dir DIR] [--target NAME]... [cmake configure arguments ...]
#   launch/build.sh                     everything (tests, benchmarks)
#   launch/build.sh --target memtrain   the executable only
#   launch/build.sh --build-dir build-cuda -DMEMTRAIN_CUDA=ON
#                                       the CUDA/NCCL build against the torch
#                                       wheel (launch/install_torch.sh first)
# A relative DIR is relative to the source folder. MEMTRAIN_BUILD_JOBS sets
# the parallel jobs (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 [--build-dir DIR] [--target NAME]... [cmake args...]"
dir=${MEMTRAIN_BUILD_DIR:-build}
target=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --target)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "$usage" >&2; exit 2; }
      if [ "$1" = --target ]; then target+=(--target "$2"); else dir=$2; fi
      shift 2
      ;;
    *) break ;;
  esac
done
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"${MEMTRAIN_BUILD_JOBS:-$(nproc)}" "${target[@]}"
