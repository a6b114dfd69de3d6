#!/usr/bin/env bash
# What this machine offers memtrain's GPU proof, in a few seconds, one
# "key: value" line each: the OS, cores, memory and disk, the driver and
# GPUs (nvidia-smi), the Python that holds torch with its torch, CUDA, cuDNN
# and NCCL versions and the devices it sees, nvcc, cmake, ninja, make, the
# C/C++ compilers, glibc and libstdc++, the tools the kit is unpacked with,
# and an MPI or HDF5 of the machine's own if any. With --bundle DIR also
# what the bundle was built against, and whether this Python's torch
# matches it. Never fails on a missing piece: it says "none".
# usage: tests/gpu/probe.sh [--python PY] [--bundle DIR]
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/launch/gpu/lib.sh"
python=python3 bundle=
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=${2:?--python needs a value}; shift 2 ;;
    --bundle) bundle=${2:?--bundle needs a value}; shift 2 ;;
    *) echo "usage: $0 [--python PY] [--bundle DIR]" >&2; exit 2 ;;
  esac
done
t0=$(date +%s.%N)
kv() { printf '%-22s %s\n' "$1:" "$2"; }
first() { head -1 | sed 's/[[:space:]]*$//'; }
ver() {  # COMMAND...: its first version line, or "none"
  command -v "$1" >/dev/null 2>&1 || { echo none; return; }
  local v
  v=$(timeout 10 "$@" 2>&1 | grep -m1 -E '[0-9]+\.[0-9]+' | sed 's/[[:space:]]*$//')
  echo "${v:-unknown} ($(command -v "$1"))"
}

kv date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
kv host "$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)"
kv os "$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}") || echo unknown); kernel $(uname -r)"
kv user "$(id -un 2>/dev/null || id -u) (uid $(id -u))"
kv cores "$(nproc) usable, $(nproc --all) online"
kv memory "$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
kv "disk free (.)" "$(df -h . 2>/dev/null | awk 'NR == 2 {print $4 " of " $2}')"

# The driver and the GPUs.
if command -v nvidia-smi >/dev/null 2>&1; then
  kv driver "$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | first)"
  kv "cuda (driver)" "$(timeout 20 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | first)"
  timeout 20 nvidia-smi --query-gpu=index,name,memory.total,compute_cap --format=csv,noheader 2>&1 |
    while read -r l; do kv gpu "$l"; done
else
  kv driver "none (no nvidia-smi)"
fi

# The Python that holds torch.
py=$(command -v "$python" 2>/dev/null || true)
if [ -z "$py" ]; then
  kv python "none ($python not found)"
else
  kv python "$("$py" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1 | first)"
  PYTHONWARNINGS=ignore timeout 60 "$py" - <<'EOF' 2>/dev/null | while read -r k v; do kv "$k" "$v"; done
import os
try:
    import torch
except Exception as e:  # noqa: BLE001
    print("torch none:", e)
    raise SystemExit
print("torch", torch.__version__, "git", torch.version.git_version[:12], os.path.dirname(torch.__file__))
print("torch_cuda", torch.version.cuda)
print("torch_cxx11_abi", int(torch._C._GLIBCXX_USE_CXX11_ABI))
try:
    print("cudnn", torch.backends.cudnn.version())
except Exception as e:  # noqa: BLE001
    print("cudnn none:", e)
try:
    v = torch.cuda.nccl.version()
    print("nccl", ".".join(map(str, v)) if isinstance(v, tuple) else v)
except Exception as e:  # noqa: BLE001
    print("nccl none:", e)
print("cuda_available", torch.cuda.is_available())
for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
    p = torch.cuda.get_device_properties(i)
    print("torch_device", f"{i}: {p.name}, {p.total_memory} B, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs")
site = os.path.dirname(os.path.dirname(torch.__file__))
libs = sorted(d for d in os.listdir(os.path.join(site, "nvidia")) if os.path.isdir(os.path.join(site, "nvidia", d, "lib"))) if os.path.isdir(os.path.join(site, "nvidia")) else []
print("nvidia_wheels", ",".join(libs) or "none", os.path.join(site, "nvidia"))
EOF
fi

# Build tools (the bundle needs none of them; a build here needs them all).
nvcc=$(find_nvcc || true)
kv nvcc "$([ -n "$nvcc" ] && "$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' | first || echo none)${nvcc:+ ($nvcc)}"
kv cmake "$(ver cmake --version)"
kv ninja "$(ver ninja --version)"
kv make "$(ver make --version)"
kv cc "$(ver cc --version)"
kv c++ "$(ver c++ --version)"
kv g++ "$(ver g++ --version)"
kv ccache "$(ver ccache --version)"
kv glibc "$(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown)"
stdcxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ && !f {print $NF; f = 1}')
kv libstdc++ "$([ -n "$stdcxx" ] && grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$stdcxx" | sort -uV | tail -1 || echo none)${stdcxx:+ ($stdcxx)}"
kv "unpack tools" "dpkg-deb: $(command -v dpkg-deb || echo none); ar: $(command -v ar || echo none); xz: $(command -v xz || echo none)"
kv "own mpi" "$(command -v mpirun || command -v mpiexec || echo none)"
# Point (h)'s needs (tests/multinode/cluster.sh): root, the programs, and
# a network namespace with a bridge and a veth pair, tried in a namespace
# of its own that takes them with it when it ends.
ns_tools=
for t in ip unshare nsenter setsid taskset mount hostname; do
  command -v "$t" >/dev/null 2>&1 || ns_tools="$ns_tools $t"
done
kv "namespace tools" "$([ -z "$ns_tools" ] && echo "all there" || echo "missing:$ns_tools (the bundle's kit carries ip)")"
if [ "$(id -u)" != 0 ]; then
  kv namespaces "no: not root (point h needs root)"
elif ! command -v unshare >/dev/null 2>&1; then
  kv namespaces "no: no unshare"
else
  ipx=$(command -v ip 2>/dev/null || true)
  [ -n "$ipx" ] || { [ -z "$bundle" ] || ipx=$(ls "$bundle"/prefix/tools/bin/ip 2>/dev/null || true); }
  if [ -z "$ipx" ]; then
    kv namespaces "$(timeout 10 unshare --net --uts true 2>&1 && echo "network and UTS: yes; bridge and veth: not tried (no ip yet: run.sh unpacks the kit's)" || echo "no: unshare --net --uts failed")"
  else
    kv namespaces "$(timeout 10 unshare --net --uts sh -c "$ipx link add mtpb type bridge && $ipx link add mtpa type veth peer name mtpc && echo 'network, UTS, bridge, veth: yes'" 2>&1 | tail -1)"
  fi
fi
kv "own hdf5" "$(command -v h5cc || ldconfig -p 2>/dev/null | awk '/libhdf5/ && !f {print $NF; f = 1}' || true)"

if [ -n "$bundle" ]; then
  if [ -f "$bundle/BUNDLE.info" ]; then
    kv bundle "$(cd "$bundle" && pwd): $(bundle_get "$bundle" built)"
    kv "bundle torch" "$(bundle_get "$bundle" torch_version) CUDA $(bundle_get "$bundle" torch_cuda) ABI $(bundle_get "$bundle" torch_cxx11_abi) git $(bundle_get "$bundle" torch_git | cut -c1-12)"
    if [ -n "$py" ] && p=$(torch_probe "$py" 2>/dev/null); then
      IFS=';' read -r tv _ tc ta _ _ _ <<<"$p"
      if [ "$tv" = "$(bundle_get "$bundle" torch_version)" ] && [ "$tc" = "$(bundle_get "$bundle" torch_cuda)" ] &&
         [ "$ta" = "$(bundle_get "$bundle" torch_cxx11_abi)" ]; then
        kv "bundle usable" "yes: $py has torch $tv CUDA $tc"
      else
        kv "bundle usable" "NO: $py has torch $tv CUDA $tc ABI $ta: tests/gpu/run.sh --bundle will build here instead"
      fi
    fi
    kv "bundle needs" "glibc >= $(bundle_get "$bundle" needs_glibc), GLIBCXX >= $(bundle_get "$bundle" needs_glibcxx)"
  else
    kv bundle "none at $bundle (no BUNDLE.info)"
  fi
fi
kv "probe took" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f s", b - a}')"
