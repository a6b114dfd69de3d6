#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit, MPI with 1, 2
# and 4 ranks, end-to-end) and each benchmark at its smallest size.
# Then the CUDA configuration, where a CUDA toolkit is found: installs the
# torch wheel (launch/install_torch.sh), builds -DMEMTRAIN_CUDA=ON into
# build-cuda, the benchmarks included, and runs its tests that need no GPU
# on the CPU, with LibTorch 2.11 (ctest names cuda_*). Then the CUDA 12
# configuration (V100): torch 2.10.0 for CUDA 12.8 (install_torch.sh
# --cuda 12), the executable built into build-cuda12 and checked.
# MEMTRAIN_CUDA_TESTS=0 skips both CUDA parts, MEMTRAIN_CUDA12=0 the second.
# It ends with a table of every test that skipped, in whole or in part, and
# why (tests/tools/skips.py); a skip for want of something this command
# installs fails it: only what the machine cannot give (a GPU, root,
# namespaces) or the configuration leaves out may skip.
set -euo pipefail
cd "$(dirname "$0")/.."
junits=()  # LABEL=FILE: each ctest run's JUnit file, every test's output whole
ctest_junit() {  # LABEL DIR CTEST_ARGS...: ctest in DIR, its JUnit file kept
  local label=$1 dir=$2
  shift 2
  rm -f "$dir/junit.xml"
  junits+=("$label=$PWD/$dir/junit.xml")
  (cd "$dir" && ctest --output-junit "$PWD/junit.xml" --test-output-size-passed 100000000 \
    --test-output-size-failed 100000000 "$@")
}
skip_table() {
  local rc=$? have=() j
  for j in "${junits[@]}"; do [ ! -f "${j#*=}" ] || have+=("$j"); done
  if [ ${#have[@]} -gt 0 ]; then
    python3 tests/tools/skips.py "${have[@]}" || { [ "$rc" != 0 ] || rc=1; }
  fi
  exit "$rc"
}
trap skip_table EXIT
bash launch/install_deps.sh
# Independent readers the tests check outputs with (tensorboard, from PyPI).
bash launch/install_peers.sh
bash launch/build.sh
source launch/env.sh
ctest_junit cpu build --output-on-failure
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
# compile times (trainer.cpp: 41 s with -O2 -g, 18 s with -O2). The
# benchmarks are built after the rest and timed apart (bench_allreduce's
# NCCL path compiles nowhere else); they run in the CPU configuration only,
# and their ctest entries are left out here (CMakeLists.txt).
release=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG")
jobs=${MEMTRAIN_BUILD_JOBS:-$(nproc)}
cmake -S . -B build-cuda -DMEMTRAIN_CUDA=ON "${release[@]}" \
  -DMEMTRAIN_BUILD_BENCHMARKS=ON >/dev/null
cmake --build build-cuda -j"$jobs" \
  --target memtrain memtrain_unit_tests memtrain_mpi_tests make_bad_h5
build=$((SECONDS - start - wheel))
cmake --build build-cuda -j"$jobs"
bench=$((SECONDS - start - wheel - build))
# The unit tests (the *_CUDA ones filter themselves out without a GPU), the
# check that no Debian LibTorch header was compiled in, and the MPI tests at
# 2 ranks, with the *_OneRank ones at 1 (cuda_mpi_np1_onerank): what
# LibTorch 2.11 changes (its kernels, its allocations, its API) shows at
# any world size, and the world sizes' own logic is the CPU
# configuration's, tested there at 1, 2 and 4 ranks (the whole suite at 1
# and 4 here took 265 and 274 s of the command's time). The end-to-end scripts run in
# the CPU configuration only, to keep the whole command within its time.
ctest_junit cuda build-cuda --output-on-failure -L cuda -LE e2e -E '^cuda_mpi_np[14]$'
echo "run_all.sh: CUDA configuration: wheel ${wheel} s, build ${build} s, benchmarks ${bench} s, tests $((SECONDS - start - wheel - build - bench)) s"

if [ "${MEMTRAIN_CUDA12:-1}" = 0 ]; then
  echo "run_all.sh: CUDA 12 configuration skipped: MEMTRAIN_CUDA12=0"
  exit 0
fi
# The CUDA 12 configuration, for V100 (sm_70), which CUDA 13 cannot target:
# torch 2.10.0 for CUDA 12.8 (docs/build.md). Only the executable and
# the test files that hold *_CUDA tests are built, to keep CI inside its
# limit: the whole library, the CLI and the GPU tests compiled against
# LibTorch 2.10 and the CUDA 12.8 headers, and the link; the tests run in
# the CUDA 13 configuration. Then: it starts, loads one cudart (12)
# and LibTorch from that venv, and with a toolkit of another CUDA major
# (nvcc 13 here) no translation unit read that toolkit's headers.
start=$SECONDS
bash launch/install_torch.sh --cuda 12
venv12=${MEMTRAIN_TORCH_CU12_VENV:-/opt/memtrain/torch-venv-cu12}
wheel=$((SECONDS - start))
bash launch/build.sh --build-dir build-cuda12 --target memtrain \
  --target memtrain_cuda_test_sources \
  -DMEMTRAIN_CUDA=ON -DMEMTRAIN_TORCH_VENV="$venv12" "${release[@]}" \
  -DMEMTRAIN_BUILD_TESTS=ON -DMEMTRAIN_BUILD_BENCHMARKS=OFF
build=$((SECONDS - start - wheel))
fail() { echo "run_all.sh: CUDA 12 configuration: $*" >&2; exit 1; }
build-cuda12/memtrain --version >/dev/null || fail "build-cuda12/memtrain --version failed"
libs=$(ldd build-cuda12/memtrain)
for lib in libcudart.so.12 libtorch_cuda.so libnccl.so.2; do
  at=$(awk -v l="$lib" '$1 == l {print $3}' <<<"$libs")
  case "$at" in "$venv12"/*) ;; *) fail "memtrain loads $lib from ${at:-nowhere}, not from $venv12" ;; esac
done
others=$(grep -oE 'libcudart\.so\.[0-9]+' <<<"$libs" | sort -u | grep -vx 'libcudart\.so\.12' || true)
[ -z "$others" ] || fail "memtrain loads a second cudart: $others"
mapfile -t deps < <(find build-cuda12 -path '*/CMakeFiles/*' -name '*.d')
nvcc_major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
if [ "$nvcc_major" != 12 ]; then
  # The toolkit's headers wherever they are: its own folder, and a default
  # include folder of the compiler that holds a copy (/usr/local/include
  # here, where nvcc is found as /usr/local/bin/nvcc on some PATHs).
  dirs=("$cuda/" "$(readlink -f "$cuda")/")
  for d in /usr/local/include /usr/include; do
    [ -f "$d/cuda_runtime.h" ] && dirs+=("$d/")
  done
  patterns=()
  for d in "${dirs[@]}"; do patterns+=(-e "$d"); done
  toolkit=$(printf '%s\0' "${deps[@]}" | xargs -0 grep -lF "${patterns[@]}" || true)
  [ -z "$toolkit" ] || fail "CUDA $nvcc_major toolkit headers (${dirs[*]}) compiled into: $toolkit"
fi
venv_re=$(sed 's/[][\.*^$+?(){}|]/\\&/g' <<<"$venv12")
wheels=$(printf '%s\0' "${deps[@]}" |
  xargs -0 grep -lE "$venv_re/lib/[^ ]*/cuda_runtime_api\.h" | wc -l || true)
[ "$wheels" -gt 0 ] || fail "no translation unit read cuda_runtime_api.h from $venv12"
echo "run_all.sh: CUDA 12 configuration: wheel ${wheel} s, build ${build} s (memtrain and the *_CUDA tests' files; ${#deps[@]} translation units, CUDA headers from $venv12 in $wheels), checks $((SECONDS - start - wheel - build)) s"
