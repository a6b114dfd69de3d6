#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit, MPI with 1, 2
# and 4 ranks, end-to-end) and each benchmark at its smallest size.
# Then the CUDA configuration, where a CUDA toolkit is found: installs the
# torch wheel (launch/install_torch.sh), builds -DMEMTRAIN_CUDA=ON into
# build-cuda and runs its tests that need no GPU on the CPU, with LibTorch
# 2.11 (ctest names cuda_*). MEMTRAIN_CUDA_TESTS=0 skips that part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install_deps.sh
# Independent readers the tests check outputs with (tensorboard, from PyPI).
bash launch/install_peers.sh
bash launch/build.sh
source launch/env.sh
(cd build && ctest --output-on-failure)
echo "run_all.sh: CPU configuration: ${SECONDS} s (dependencies, build, tests)"

if [ "${MEMTRAIN_CUDA_TESTS:-1}" = 0 ]; then
  echo "run_all.sh: CUDA configuration skipped: MEMTRAIN_CUDA_TESTS=0"
  exit 0
fi
nvcc=$(command -v nvcc || true)
for d in ${CUDA_HOME:+"$CUDA_HOME/bin"} /usr/local/cuda/bin; do
  [ -n "$nvcc" ] || [ ! -x "$d/nvcc" ] || nvcc=$d/nvcc
done
header=
if [ -n "$nvcc" ]; then
  cuda=$(dirname "$(dirname "$nvcc")")
  for h in "$cuda"/include/cuda_runtime.h "$cuda"/targets/*/include/cuda_runtime.h; do
    [ -f "$h" ] && header=$h
  done
fi
if [ -z "$header" ]; then
  echo "run_all.sh: CUDA configuration skipped: no CUDA toolkit found (nvcc and cuda_runtime.h; PATH, \$CUDA_HOME, /usr/local/cuda)"
  exit 0
fi
start=$SECONDS
bash launch/install_torch.sh
wheel=$((SECONDS - start))
# Built to be tested here, not run on a GPU: no debug info, which halves its
# compile times (trainer.cpp: 41 s with -O2 -g, 18 s with -O2); the
# benchmarks run in the CPU configuration only.
bash launch/build.sh --build-dir build-cuda -DMEMTRAIN_CUDA=ON \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
  -DMEMTRAIN_BUILD_BENCHMARKS=OFF
build=$((SECONDS - start - wheel))
# The unit tests (the *_CUDA ones filter themselves out without a GPU), the
# check that no Debian LibTorch header was compiled in, and the MPI tests at
# 1, 2 and 4 ranks. The end-to-end scripts run in the CPU configuration
# only, to keep the whole command within its time.
(cd build-cuda && ctest --output-on-failure -L cuda -LE e2e)
echo "run_all.sh: CUDA configuration: wheel ${wheel} s, build ${build} s, tests $((SECONDS - start - wheel - build)) s"
