# Helpers sourced by launch/gpu/build_offline.sh and tests/gpu/run.sh.

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

# torch_probe PYTHON: prints "version;cmake_prefix_path;cuda;abi;site" of the
# torch PYTHON imports, or fails with the reason on stderr.
torch_probe() {
  "$1" - <<'EOF'
import sys
try:
    import torch, torch.utils
except Exception as e:  # noqa: BLE001
    sys.exit(f"cannot import torch: {e}")
import os
site = os.path.dirname(os.path.dirname(torch.__file__))
print(torch.__version__.split("+")[0], torch.utils.cmake_prefix_path, torch.version.cuda,
      int(torch._C._GLIBCXX_USE_CXX11_ABI), site, sep=";")
EOF
}

# kit_lib_dirs PREFIX: the library folders of an unpacked kit, colon-separated.
kit_lib_dirs() {
  local p=$1/usr/lib/x86_64-linux-gnu
  echo "$p:$1/lib/x86_64-linux-gnu:$p/openmpi/lib:$p/hdf5/serial:$p/pmix2/lib"
}
