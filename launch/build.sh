#!/usr/bin/env bash
# Configures and builds memtrain into ./build (tests and benchmarks included).
# Extra arguments go to cmake's configure step (e.g. -DMEMTRAIN_CUDA=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j"$(nproc)"
