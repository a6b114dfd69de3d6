# Helpers sourced by the scripts of launch/gpu/ and tests/gpu/.

die() {  # MESSAGE...: one line on stderr naming the script, exit 1
  echo "$(basename "$0"): $*" >&2
  exit 1
}
say() { echo "$(basename "$0"): $*"; }

# version_ge A B: A >= B as dotted versions.
version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$2" ]; }

# find_nvcc: prints the nvcc of PATH, $CUDA_HOME or /usr/local/cuda; fails silently.
find_nvcc() {
  local n
  n=$(command -v nvcc 2>/dev/null || true)
  for d in ${CUDA_HOME:+"$CUDA_HOME/bin"} /usr/local/cuda/bin; do
    [ -n "$n" ] || [ ! -x "$d/nvcc" ] || n=$d/nvcc
  done
  [ -n "$n" ] && echo "$n"
}

# torch_probe PYTHON: prints "version;cmake_prefix_path;cuda;abi;site;git;nccl"
# of the torch PYTHON imports (version without its +local label, git: the
# commit it was built from, nccl: the NCCL version it was built with or
# none), or fails with the reason on stderr. Needs no GPU.
torch_probe() {
  "$1" - <<'EOF2'
import sys
try:
    import torch, torch.utils
except Exception as e:  # noqa: BLE001
    sys.exit(f"cannot import torch: {e}")
import os
site = os.path.dirname(os.path.dirname(torch.__file__))
try:
    v = torch.cuda.nccl.version()
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception:  # noqa: BLE001
    nccl = "none"
print(torch.__version__.split("+")[0], torch.utils.cmake_prefix_path, torch.version.cuda,
      int(torch._C._GLIBCXX_USE_CXX11_ABI), site, torch.version.git_version, nccl, sep=";")
EOF2
}

# torch_lib_path SITE: the folders the CUDA build's executables load LibTorch
# and the NVIDIA wheels' libraries (cudart, NCCL, cuBLAS, cuDNN, ...) from,
# under the site-packages folder SITE, colon-separated.
torch_lib_path() {
  local d out=$1/torch/lib
  for d in "$1"/nvidia/*/lib; do
    [ ! -d "$d" ] || out=$out:$d
  done
  echo "$out"
}

# kit_lib_dirs PREFIX: the library folders of an unpacked kit, colon-separated.
kit_lib_dirs() {
  local p=$1/usr/lib/x86_64-linux-gnu
  echo "$p:$1/lib/x86_64-linux-gnu:$p/openmpi/lib:$p/hdf5/serial:$p/pmix2/lib"
}

# apt_closure WORK PKG...: the packages apt would install for PKG... on an
# empty system (Depends and Pre-Depends, no Recommends), one a line, sorted.
# Root is not needed: an empty dpkg status file WORK/status, no locking.
apt_closure() {
  local work=$1
  shift
  [ -f "$work/status" ] || : >"$work/status"
  if ! apt-get -o Dir::State::status="$work/status" -o Debug::NoLocking=1 -s install \
      --no-install-recommends "$@" >"$work/apt.out" 2>"$work/apt.err"; then
    cat "$work/apt.err" >&2
    return 1
  fi
  awk '/^Inst /{print $2}' "$work/apt.out" | sort -u
}

# debian_base WORK: prints the packages a Debian-like node that can compile
# surely has: the closure of every package of Priority required or important
# or Essential, and of build-essential (libc6, libstdc++6, zlib1g, libssl3,
# gcc, g++, make, ...). What the kit leaves out and what
# tests/gpu/hide_system.sh leaves visible.
debian_base() {
  local work=$1
  apt-cache dumpavail | awk '/^Package:/{p=$2} /^Priority: (required|important)$/{print p}
    /^Essential: yes$/{print p}' | sort -u >"$work/base-roots"
  [ -s "$work/base-roots" ] || { echo "apt knows no packages: run apt-get update (as root) first" >&2; return 1; }
  # shellcheck disable=SC2046
  apt_closure "$work" build-essential $(cat "$work/base-roots")
}

# bundle_get DIR KEY: the value of KEY in DIR/BUNDLE.info ("KEY VALUE" lines).
bundle_get() { awk -v k="$2" '$1 == k {sub(/^[^ ]+ /, ""); print; exit}' "$1/BUNDLE.info"; }

# elf_needs PATTERN FILE...: the newest symbol version matching PATTERN
# (GLIBC_2\.[0-9]*, GLIBCXX_3\.4\.[0-9]*) the ELF files ask for.
elf_needs() {
  local pat=$1
  shift
  readelf -V "$@" 2>/dev/null | grep -o "$pat" | sort -uV | tail -1 || true
}
