#!/usr/bin/env bash
# Prepares here, for a GPU node without network, root or a build, one folder
# (default gpu-bundle, at most 48 MiB) that tests/gpu/run.sh --bundle runs
# the GPU proof from:
#   kit/         the Debian packages launch/gpu/prepare_offline.sh computes
#                (Open MPI, HDF5, yaml-cpp, libpng, libjpeg, ICU, ...; MANIFEST;
#                TOOLS: iproute2's ip)
#   bin.tar.xz   the CUDA configuration's executables, stripped: memtrain,
#                memtrain_unit_tests, memtrain_mpi_tests, bench_memory,
#                bench_overlap, built here against the torch wheel that
#                --python holds (the node must have the same torch version,
#                CUDA version and C++ ABI; run.sh checks and otherwise builds
#                there with launch/gpu/build_offline.sh from kit/)
#   src/         what run.sh reads besides the executables: tests/gpu,
#                tests/peers/safetensors_read.py, tests/data, launch/gpu,
#                launch/env.sh, launch/configs/unet3d-v100.yaml,
#                benchmarks/vs_pytorch
#   BUNDLE.info  what it was built from and against; SHA256SUMS; README.md
#                (how to run it, its size)
# usage: launch/gpu/bundle.sh [DIR] [--build-dir B] [--python PY] [--kit KIT]
#                             [--max-mib N]
#   DIR          default gpu-bundle (relative to the current folder); made
#                afresh (DIR.new, then renamed)
#   --build-dir  the CUDA build folder (default build-bundle, relative to the
#                source folder), configured Release -O2 and built here for
#                the five targets only (ccache makes a rebuild cheap)
#   --python     the Python whose torch the executables are built against
#                (default $MEMTRAIN_TORCH_VENV/bin/python, else
#                /opt/memtrain/torch-venv/bin/python: launch/install_torch.sh)
#   --kit KIT    copy this kit (a folder prepare_offline.sh made) instead of
#                downloading one (needs Debian's registry)
#   --max-mib N  refuse a bundle over N MiB (default 48)
# MEMTRAIN_BUILD_JOBS: parallel compile jobs (default: the number of cores).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/launch/gpu/lib.sh"
usage="usage: $0 [DIR] [--build-dir B] [--python PY] [--kit KIT] [--max-mib N]"
dir=gpu-bundle build=build-bundle kit= max=48
python=${MEMTRAIN_TORCH_VENV:-/opt/memtrain/torch-venv}/bin/python
pos=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --python | --kit | --max-mib)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      case "$1" in --build-dir) build=$2 ;; --python) python=$2 ;; --kit) kit=$2 ;; --max-mib) max=$2 ;; esac
      shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) pos+=("$1"); shift ;;
  esac
done
[ ${#pos[@]} -le 1 ] || { echo "$usage" >&2; exit 2; }
[ ${#pos[@]} = 0 ] || dir=${pos[0]}
[[ "$max" =~ ^[0-9]+$ ]] || die "--max-mib must be a whole number of MiB, got $max"
case "$build" in /*) ;; *) build=$src/$build ;; esac
mkdir -p "$(dirname "$dir")"
dir=$(cd "$(dirname "$dir")" && pwd)/$(basename "$dir")
case "$dir" in "$src" | / | "$src/src" | "$src/tests" | "$src/launch") die "refusing to replace $dir: name a folder of its own" ;; esac
for tool in strip readelf tar xz sha256sum; do
  command -v $tool >/dev/null || die "needs $tool (binutils, tar, xz-utils, coreutils)"
done
TARGETS=(memtrain memtrain_unit_tests memtrain_mpi_tests bench_memory bench_overlap)
start=$SECONDS
times=()
step() { times+=("$1: $2 s"); say "$1: $2 s"; }

# 1. The torch the executables are built against.
[ -x "$python" ] || command -v "$python" >/dev/null ||
  die "no $python: install the torch wheel (bash launch/install_torch.sh) or pass --python"
probe=$(torch_probe "$python" 2>/tmp/bundle-torch.err) ||
  die "$python: $(tail -1 /tmp/bundle-torch.err) (bash launch/install_torch.sh, or --python)"
IFS=';' read -r tv tcmake tcuda tabi site tgit tnccl <<<"$probe"
[ "$tcuda" != None ] || die "$python has torch $tv without CUDA: the bundle needs a CUDA build of torch"
venv=$("$python" -c 'import sys; print(sys.prefix)')
say "torch $tv (CUDA $tcuda, C++11 ABI $tabi, git ${tgit:0:12}, NCCL $tnccl) from $python"

# 2. The CUDA configuration's executables, built here.
t0=$SECONDS
mkdir -p "$build"
cmake -S "$src" -B "$build" -DMEMTRAIN_CUDA=ON -DMEMTRAIN_TORCH_VENV="$venv" \
  -DMEMTRAIN_TORCH_PYTHON="$python" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
  -DMEMTRAIN_BUILD_TESTS=ON -DMEMTRAIN_BUILD_BENCHMARKS=ON >"$build/bundle-configure.log" 2>&1 ||
  { tail -30 "$build/bundle-configure.log" >&2; die "cmake configure of $build failed (log: $build/bundle-configure.log)"; }
grep -q '^MEMTRAIN_CUDA:BOOL=ON' "$build/CMakeCache.txt" || die "$build is not a -DMEMTRAIN_CUDA=ON build"
cmake --build "$build" -j"${MEMTRAIN_BUILD_JOBS:-$(nproc)}" --target "${TARGETS[@]}" >"$build/bundle-build.log" 2>&1 ||
  { grep -E 'error|Error' "$build/bundle-build.log" | head -20 >&2; die "building ${TARGETS[*]} in $build failed (log: $build/bundle-build.log)"; }
step "build (${TARGETS[*]}) in $build" $((SECONDS - t0))
headers=$(bash "$src/tests/tools/check_torch_headers.sh" "$build" "$site/torch/include" 2>&1) ||
  die "LibTorch headers: $headers"
nccl=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
nccl=$(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$nccl/nccl.h" | awk '{print $3}' | paste -sd.)

stage=$dir.new
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/src"
trap 'rm -rf "$stage"' EXIT

# 3. The kit.
t0=$SECONDS
if [ -n "$kit" ]; then
  [ -f "$kit/MANIFEST" ] || die "$kit has no MANIFEST: not a kit from launch/gpu/prepare_offline.sh"
  (cd "$kit" && awk '!/^#/{print $3 "  " $5}' MANIFEST | sha256sum --quiet -c -) ||
    die "a package in $kit does not match its MANIFEST: make the kit again"
  mkdir -p "$stage/kit/debs" "$stage/kit/tools"
  cp "$kit/MANIFEST" "$stage/kit/"
  awk '!/^#/{print $5}' "$kit/MANIFEST" | while read -r f; do cp "$kit/$f" "$stage/kit/debs/"; done
  if [ -f "$kit/TOOLS" ]; then
    cp "$kit/TOOLS" "$stage/kit/"
    awk '!/^#/{print $5}' "$kit/TOOLS" | while read -r f; do cp "$kit/$f" "$stage/kit/tools/"; done
  else
    say "note: $kit has no TOOLS (made before they were added): no ip of the kit's for point (h)"
  fi
  step "kit copied from $kit" $((SECONDS - t0))
else
  bash "$src/launch/gpu/prepare_offline.sh" "$stage/kit" | grep -v 'on the GPU node' ||
    die "prepare_offline.sh failed: it needs Debian's registry (apt-get update), or pass --kit KIT"
  step "kit made (prepare_offline.sh: apt-get download)" $((SECONDS - t0))
fi

# 4. The executables: stripped; each library they name must come from the
# node's torch (torch/lib, nvidia/*/lib), the kit or the base system.
t0=$SECONDS
for t in "${TARGETS[@]}"; do
  f=$(find "$build" -maxdepth 3 -type f -name "$t" -perm -u+x -print -quit)
  [ -n "$f" ] || die "no $t under $build"
  strip --strip-unneeded -o "$stage/bin/$t" "$f"
done
work=$(mktemp -d)
trap 'rm -rf "$stage" "$work"' EXIT
for d in "$stage"/kit/debs/*.deb; do dpkg-deb -c "$d"; done | awk '{print $6}' | sed 's|.*/||' | sort -u >"$work/kit-files"
(ls "$site/torch/lib"; for d in "$site"/nvidia/*/lib; do ls "$d"; done) | sort -u >"$work/torch-files"
debian_base "$work" >"$work/base" || die "cannot compute the base system (apt-get -s)"
unknown=()
for s in $(readelf -d "$stage"/bin/* | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u); do
  grep -qxF "$s" "$work/torch-files" && continue
  grep -qxF "$s" "$work/kit-files" && continue
  path=$(ldconfig -p | awk -v s="$s" '$1 == s && /x86-64/ && !f {print $NF; f = 1}')
  owner=
  for f in "$path" "/usr$path" "${path#/usr}"; do
    [ -n "$owner" ] || [ -z "$path" ] || owner=$(dpkg -S "$f" 2>/dev/null | awk -F: 'NR == 1 {print $1}' || true)
  done
  [ -n "$owner" ] && grep -qx "$owner" "$work/base" || unknown+=("$s (here: ${path:-not found}, package ${owner:-none})")
done
[ ${#unknown[@]} = 0 ] ||
  die "the executables need libraries that neither the node's torch, the kit nor a base system has: ${unknown[*]} (add their packages to prepare_offline.sh's ROOTS)"
glibc=$(elf_needs 'GLIBC_2\.[0-9]*' "$stage"/bin/*)
glibcxx=$(elf_needs 'GLIBCXX_3\.4\.[0-9]*' "$stage"/bin/*)
grep -qaF "$src/tests/data" "$stage/bin/memtrain_unit_tests" || die "memtrain_unit_tests does not name $src/tests/data"
raw=$(du -cb "$stage"/bin/* | tail -1 | cut -f1)
tar -C "$stage/bin" -cf - "${TARGETS[@]}" | xz -T0 -6 >"$stage/bin.tar.xz"
rm -rf "${stage:?}/bin"
step "strip, check libraries, xz ($((raw / 1048576)) MiB stripped)" $((SECONDS - t0))

# 5. What run.sh reads besides the executables.
(cd "$src" && cp --parents -r tests/gpu tests/multinode/cluster.sh launch/gpu launch/env.sh launch/configs/unet3d-v100.yaml \
  tests/peers/safetensors_read.py tests/data benchmarks/vs_pytorch "$stage/src/")
find "$stage/src" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$stage/src/benchmarks/vs_pytorch/results"  # figures of earlier runs

# 6. BUNDLE.info, SHA256SUMS, README.md.
commit=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
id=$(cat "$stage/bin.tar.xz" "$stage/kit/MANIFEST" "$stage/kit/TOOLS" 2>/dev/null | sha256sum | cut -c1-16)
built="$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) from commit $commit$([ "$dirty" = 0 ] || echo " with $dirty changed files") against torch $tv (CUDA $tcuda)"
cat >"$stage/BUNDLE.info" <<EOF
id $id
built $built
torch_version $tv
torch_cuda $tcuda
torch_cxx11_abi $tabi
torch_git $tgit
torch_nccl $tnccl
nccl $nccl
torch_site_here $site
source_commit $commit
source_changed_files $dirty
build_type Release, -O2 -DNDEBUG, TORCH_CUDA_ARCH_LIST $(sed -n 's/^TORCH_CUDA_ARCH_LIST:STRING=//p' "$build/CMakeCache.txt")
executables ${TARGETS[*]}
test_data $src/tests/data
needs_glibc ${glibc#GLIBC_}
needs_glibcxx ${glibcxx#GLIBCXX_}
headers_check $headers
EOF
(cd "$stage" && find . -type f ! -name SHA256SUMS ! -name README.md | sed 's|^\./||' | sort | xargs sha256sum >SHA256SUMS)
npk=$(grep -vc '^#' "$stage/kit/MANIFEST")
kitb=$(du -sb "$stage/kit" | cut -f1)
binb=$(stat -c %s "$stage/bin.tar.xz")
srcb=$(du -sb "$stage/src" | cut -f1)
readme() {  # TOTAL_BYTES: the README, with the size printed at a fixed width
  cat <<EOF
# memtrain GPU bundle

Size: $(printf '%10d' "$1") bytes ($(awk -v b="$1" 'BEGIN {printf "%5.1f", b / 1048576}') MiB), this README included:
kit/ $npk packages $kitb B, bin.tar.xz $binb B ($((raw / 1048576)) MiB unpacked), src/ $srcb B.
Built $built;
torch git $tgit, NCCL $nccl; needs glibc >= ${glibc#GLIBC_} and libstdc++ GLIBCXX >= ${glibcxx#GLIBCXX_}.

On the GPU node (no network, no root, no build), from a memtrain checkout
that has this folder at gpu-bundle/ (the device tool: carry ["gpu-bundle"]):

    bash tests/gpu/probe.sh --bundle gpu-bundle
    bash tests/gpu/run.sh --bundle gpu-bundle --points a,c --out runs/gpu-1
    bash tests/gpu/run.sh --bundle gpu-bundle --points b,d,e,h --no-ctest --out runs/gpu-2

or without a checkout, from this folder's own copy of the scripts:

    bash gpu-bundle/src/tests/gpu/run.sh --bundle gpu-bundle --points a,c

The Python that holds torch: python3, or --python PY. Its torch must be
$tv for CUDA $tcuda (C++11 ABI $tabi); with another, run.sh says so and
builds with launch/gpu/build_offline.sh from kit/ (a checkout, nvcc,
cmake and g++ needed). tests/gpu/README.md: the whole procedure and times.
EOF
}
readme 0 >"$stage/README.md"
total=$(du -sb "$stage" | cut -f1)
readme "$total" >"$stage/README.md"
[ "$(du -sb "$stage" | cut -f1)" = "$total" ] || die "internal: the README's size changed with its number"
limit=$((max * 1048576))
[ "$total" -le "$limit" ] ||
  die "the bundle is $total bytes, over --max-mib $max ($limit): kit $kitb, executables $binb, src $srcb"
rm -rf "$dir"
mv "$stage" "$dir"
trap 'rm -rf "$work"' EXIT
step "whole bundle.sh" $((SECONDS - start))
say "$dir: $total bytes ($(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}') MiB): kit $npk packages $kitb B, bin.tar.xz $binb B, src $srcb B; torch $tv CUDA $tcuda"
printf '  %s\n' "${times[@]}"
