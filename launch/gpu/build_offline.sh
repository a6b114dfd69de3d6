#!/usr/bin/env bash
# Builds memtrain's CUDA configuration on a GPU node without network and
# without root, from the package folder launch/gpu/prepare_offline.sh made.
# usage: launch/gpu/build_offline.sh DIR [PREFIX] [--build-dir B] [--python PY]
#                                    [--targets T1,T2,...] [--hide-system] [--no-build]
#   DIR          the kit (DIR/MANIFEST, DIR/debs/*.deb; DIR/TOOLS, DIR/tools/*.deb)
#   PREFIX       where the packages are unpacked (default DIR/prefix; never /)
#   --build-dir  default build-gpu (relative to the source folder)
#   --python     the Python that holds PyTorch 2.x for CUDA (default python3)
#   --targets    build only these CMake targets (default: all of them), e.g.
#                memtrain,memtrain_unit_tests,memtrain_mpi_tests,bench_memory
#   --hide-system  CMake ignores /usr's packages (a test on a machine that
#                has Open MPI/HDF5 installed: the kit's must be the ones used)
#   --no-build   unpack, relocate and check MPI only (the check compiles a
#                small MPI program when a C compiler is there; without one it
#                is left to the caller: tests/gpu/run.sh --bundle runs
#                mpiexec -np 2 memtrain --version)
# Then: source PREFIX/env.sh (PATH, LD_LIBRARY_PATH, OPAL_PREFIX, MEMTRAIN_MPIEXEC,
# MEMTRAIN_BUILD_DIR) and run B/memtrain or tests/gpu/run.sh --prefix PREFIX.
# MEMTRAIN_BUILD_JOBS: parallel compile jobs (default: the number of cores).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/launch/gpu/lib.sh"
usage="usage: $0 DIR [PREFIX] [--build-dir B] [--python PY] [--targets T1,T2] [--hide-system] [--no-build]"
pos=() build=build-gpu python=python3 hide=0 nobuild=0 targets=
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --python | --targets)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      case "$1" in --python) python=$2 ;; --targets) targets=$2 ;; *) build=$2 ;; esac
      shift 2 ;;
    --hide-system) hide=1; shift ;;
    --no-build) nobuild=1; shift ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) pos+=("$1"); shift ;;
  esac
done
[ ${#pos[@]} -ge 1 ] && [ ${#pos[@]} -le 2 ] || { echo "$usage" >&2; exit 2; }
kit=$(cd "${pos[0]}" 2>/dev/null && pwd) || die "no kit folder ${pos[0]} (make it with launch/gpu/prepare_offline.sh)"
[ -f "$kit/MANIFEST" ] || die "$kit has no MANIFEST: not a kit from launch/gpu/prepare_offline.sh"
prefix=${pos[1]:-$kit/prefix}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd -P)
case "$prefix" in / | /usr | /usr/local | /opt | /etc) die "refusing to unpack over $prefix: give a folder of its own" ;; esac
case "$build" in /*) ;; *) build=$src/$build ;; esac
start=$SECONDS

# 1. The kit is whole and this node can run it.
(cd "$kit" && awk '!/^#/{print $3 "  " $5}' MANIFEST | sha256sum --quiet -c -) ||
  die "a package in $kit does not match its MANIFEST sha256: copy the kit again"
need_glibc=$(sed -n 's/^# needs-glibc: //p' "$kit/MANIFEST")
have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
[ -z "$need_glibc" ] || version_ge "${have_glibc:-0}" "$need_glibc" ||
  die "the kit's libraries need glibc >= $need_glibc, this node has ${have_glibc:-none}: make the kit on an older Debian"
cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
[ -n "$cxx" ] || [ "$nobuild" = 1 ] ||
  die "no C++ compiler (c++, g++ or \$CXX): the node needs g++ >= 9 (cmake too, or a kit made with --with-toolchain)"
need_cxx=$(sed -n 's/^# needs-glibcxx: //p' "$kit/MANIFEST")
if [ -n "$cxx" ]; then
  libstdcxx=$("$cxx" -print-file-name=libstdc++.so.6)
else
  libstdcxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ && !f {print $NF; f = 1}')
fi
if [ -n "$need_cxx" ] && [ -f "$libstdcxx" ] && ! grep -qa "GLIBCXX_$need_cxx" "$libstdcxx"; then
  die "the kit's C++ libraries need libstdc++ GLIBCXX_$need_cxx, $libstdcxx lacks it: use a newer g++"
fi

# 2. Unpack (no root: dpkg-deb -x, or ar + tar), then what relocation needs.
unpack() {  # DEB DEST
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
  else
    command -v ar >/dev/null || die "neither dpkg-deb nor ar (binutils) to unpack .deb files"
    local t
    t=$(mktemp -d)
    (cd "$t" && ar x "$1" && tar -xf data.tar.* -C "$2")
    rm -rf "$t"
  fi
}
say "unpacking $(grep -vc '^#' "$kit/MANIFEST") packages into $prefix"
awk '!/^#/{print $5}' "$kit/MANIFEST" | while read -r deb; do unpack "$kit/$deb" "$prefix"; done
# The tools (prepare_offline.sh's TOOLS: iproute2's ip), apart from the
# kit in PREFIX/tools/root: each program gets a wrapper in PREFIX/tools/bin
# that runs it through the loader with the tools' library folders alone
# (--library-path: neither the kit's nor the node's libraries are touched,
# and what the program runs, `ip netns exec CMD`, inherits nothing of it).
# env.sh puts PREFIX/tools/bin last on PATH: the node's own programs first.
T=$prefix/tools
rm -rf "$T"
if [ -f "$kit/TOOLS" ]; then
  (cd "$kit" && awk '!/^#/{print $3 "  " $5}' TOOLS | sha256sum --quiet -c -) ||
    die "a package in $kit/tools does not match its TOOLS sha256: copy the kit again"
  mkdir -p "$T/root" "$T/bin"
  awk '!/^#/{print $5}' "$kit/TOOLS" | while read -r deb; do unpack "$kit/$deb" "$T/root"; done
  loader=/lib64/ld-linux-x86-64.so.2
  for prog in $(sed -n 's/^# programs: //p' "$kit/TOOLS"); do
    cat >"$T/bin/$(basename "$prog")" <<EOF
#!/bin/sh
# Written by launch/gpu/build_offline.sh: the kit's $prog with its own libraries.
exec $loader --library-path "$T/root/lib/x86_64-linux-gnu:$T/root/usr/lib/x86_64-linux-gnu" "$T/root$prog" "\$@"
EOF
    chmod +x "$T/bin/$(basename "$prog")"
  done
fi
L=$prefix/usr/lib/x86_64-linux-gnu
# Absolute links into /usr or /lib: into the prefix, or to the node's copy
# of a base library (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13).
find "$prefix" -type l -lname '/*' | while read -r l; do
  t=$(readlink "$l")
  if [ -e "$prefix$t" ]; then
    ln -sfn "$prefix$t" "$l"
  elif [ ! -e "$t" ]; then
    so=$(basename "$l")
    sys=$(ldconfig -p 2>/dev/null | awk -v s="$so" 'index($1, s ".") == 1 && !f {print $NF; f = 1}')
    if [ -n "$sys" ]; then ln -sfn "$sys" "$l"; else say "note: $l -> $t missing on this node"; fi
  fi
done
for pc in $(find "$prefix" -name '*.pc'); do
  sed -i "s|^prefix=/usr\$|prefix=$prefix/usr|; s|^libdir=/usr|libdir=$prefix/usr|; s|^includedir=/usr|includedir=$prefix/usr|" "$pc"
done
# HDF5's compiler wrapper: its own prefix; no static-link libraries (the
# shared libhdf5 names what it needs; their -dev links are not in the kit).
for w in "$prefix"/usr/bin/h5cc "$prefix"/usr/bin/h5c++; do
  [ -f "$w" ] && [ ! -L "$w" ] || continue
  sed -i "s|^prefix=\"/usr\"|prefix=\"$prefix/usr\"|; s|^H5BLD_LIBS=.*|H5BLD_LIBS=\"\"|" "$w"
done
# Shared libraries outside the library folders (Debian's alternatives would
# link them, e.g. libpsm1/libpsm_infinipath.so.1.16): a SONAME link in $L.
find "$prefix" -type f -name 'lib*.so.*' ! -path "$L/*" ! -path "$prefix/lib/x86_64-linux-gnu/*" |
  while read -r f; do
    s=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ -z "$s" ] || [ -e "$L/$s" ] || ln -s "$f" "$L/$s"
  done
# The names Debian's alternatives would make.
for n in mpirun mpiexec mpicc; do ln -sfn "$n.openmpi" "$prefix/usr/bin/$n"; done

cat >"$prefix/env.sh" <<EOF
# Written by launch/gpu/build_offline.sh: the relocated Open MPI and HDF5 of
# $kit. Source it before mpiexec, ctest or tests/gpu/run.sh.
export PATH="$prefix/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$(kit_lib_dirs "$prefix")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$prefix/usr"
export OPAL_SYSCONFDIR="$prefix/etc/openmpi"
# PMIx (Debian's, configured under $L/pmix2): its plugins (pcompress,
# gds, ...) and help files by these, not by PMIX_PREFIX alone.
export PMIX_PREFIX="$L/pmix2"
export PMIX_LIBDIR="$L/pmix2/lib"
export PMIX_PKGLIBDIR="$L/pmix2/lib/pmix"
export PMIX_DATADIR="$L/pmix2/share"
export PMIX_PKGDATADIR="$L/pmix2/share/pmix"
export HWLOC_PLUGINS_PATH="$L/hwloc"
export UCX_MODULE_DIR="$L/ucx"
export FI_PROVIDER_PATH="$L/libfabric"
export MEMTRAIN_MPIEXEC="$prefix/usr/bin/mpiexec.openmpi"
# Open MPI's rsh launcher insists on finding its agent (ssh, rsh) even when
# every rank is local; a node without either (ssh is no part of the kit):
# an agent that exists and is never called.
command -v ssh >/dev/null 2>&1 || command -v rsh >/dev/null 2>&1 ||
  export OMPI_MCA_plm_rsh_agent=\${OMPI_MCA_plm_rsh_agent:-false}
export MEMTRAIN_BUILD_DIR="$build"
export MEMTRAIN_KIT_PREFIX="$prefix"
# The kit's tools (ip) where the node has none of its own.
[ ! -d "$T/bin" ] || export PATH="\$PATH:$T/bin"
EOF
source "$prefix/env.sh"
source "$src/launch/env.sh"

# 3. The relocated Open MPI runs 1 and 2 ranks of a program built here.
mkdir -p "$prefix/check"
cat >"$prefix/check/mpi_check.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int one = rank + 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  char v[MPI_MAX_LIBRARY_VERSION_STRING]; int n;
  MPI_Get_library_version(v, &n);
  if (rank == 0) printf("mpi_check: %d ranks, allreduce %d (expect %d); %.24s\n", size, sum, size * (size + 1) / 2, v);
  MPI_Finalize();
  return sum == size * (size + 1) / 2 ? 0 : 1;
}
EOF
cc=${CC:-$(command -v cc || command -v gcc || true)}
if [ -n "$cc" ]; then
  "$cc" -I"$L/openmpi/include" "$prefix/check/mpi_check.c" -o "$prefix/check/mpi_check" \
    -L"$L/openmpi/lib" -lmpi -Wl,-rpath,"$L/openmpi/lib" ||
    die "compiling against the kit's mpi.h/libmpi failed"
  for np in 1 2; do
    out=$(timeout 120 "$MEMTRAIN_MPIEXEC" --oversubscribe -np $np "$prefix/check/mpi_check" 2>&1) ||
      die "mpiexec -np $np of the kit's Open MPI failed: $out"
    say "mpiexec -np $np: $(grep 'mpi_check:' <<<"$out")"
    # Help text instead of silence: a plugin or help file not found where
    # the relocated prefix should have put it.
    ! grep -q 'Sorry!\|-----------' <<<"$out" ||
      say "warning: mpiexec -np $np also printed: $(grep -v 'mpi_check:' <<<"$out" | tr -s '\n -' ' ' | cut -c1-400)"
  done
  libmpi=$(ldd "$prefix/check/mpi_check" | awk '$1 ~ /^libmpi\.so/ {print $3}')
  case "$libmpi" in "$prefix"/*) ;; *) die "mpi_check loaded $libmpi, not the kit's libmpi" ;; esac
else
  [ "$nobuild" = 1 ] || die "no C compiler (cc, gcc or \$CC)"
  say "note: no C compiler: the MPI check is left to the caller"
fi
[ "$nobuild" = 0 ] || { say "unpacked and checked in $((SECONDS - start)) s (--no-build)"; exit 0; }

# 4. PyTorch, CUDA, NCCL as this node has them.
py=$(command -v "$python" || true)
[ -n "$py" ] || die "no $python: give the Python that holds PyTorch with --python"
probe=$(torch_probe "$py" 2>"$prefix/torch-probe.err") ||
  die "$py: $(tail -1 "$prefix/torch-probe.err") (install PyTorch 2.x for CUDA in it, or pass --python)"
IFS=';' read -r tv tcmake tcuda tabi site tgit tnccl <<<"$probe"
version_ge "$tv" 2.4 || die "$py has torch $tv; the CUDA build needs torch >= 2.4 (LibTorch 2.x)"
[ "$tcuda" != None ] || die "$py has torch $tv without CUDA (a CPU wheel): install a CUDA build of torch"
venv=$("$py" -c 'import sys; print(sys.prefix)')
nvcc=$(find_nvcc) || die "no nvcc (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin): Torch's CMake config needs the CUDA toolkit"
ncuda=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
[ "${ncuda%%.*}" = "${tcuda%%.*}" ] ||
  die "nvcc is CUDA $ncuda, torch was built for CUDA $tcuda: put a CUDA ${tcuda%%.*} toolkit first (CUDA_HOME)"
nccl=
for d in "$site/nvidia/nccl/include" "$(dirname "$(dirname "$nvcc")")/include"; do
  [ -n "$nccl" ] || [ ! -f "$d/nccl.h" ] || nccl=$d/nccl.h
done
[ -n "$nccl" ] || die "no nccl.h in $site/nvidia/nccl/include (the nvidia-nccl wheel) nor in the toolkit"
say "torch $tv (CUDA $tcuda, cxx11 abi $tabi) from $py; nvcc $ncuda ($nvcc); $nccl"
command -v cmake >/dev/null || die "no cmake on PATH: pip's cmake, the node's, or a kit made with --with-toolchain"

# 5. Configure and build -DMEMTRAIN_CUDA=ON against the kit.
args=(-DMEMTRAIN_CUDA=ON -DMEMTRAIN_TORCH_VENV="$venv" -DMEMTRAIN_TORCH_PYTHON="$py"
      -DCMAKE_CUDA_COMPILER="$nvcc"
      -DCMAKE_PREFIX_PATH="$prefix/usr"
      -DMPI_C_COMPILER="$prefix/usr/bin/mpicc.openmpi"
      -DMPIEXEC_EXECUTABLE="$MEMTRAIN_MPIEXEC"
      -DHDF5_C_COMPILER_EXECUTABLE="$prefix/usr/bin/h5cc"
      -DMEMTRAIN_PYTHON="$(command -v python3 || echo "$py")"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG")
# Debian's multiarch include folder (libjpeg62-turbo-dev's jconfig.h): the
# compiler searches /usr/include/x86_64-linux-gnu by itself, the kit's copy
# only when named.
ma=$prefix/usr/include/$("$cxx" -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
[ ! -d "$ma" ] || args+=("-DCMAKE_C_STANDARD_INCLUDE_DIRECTORIES=$ma" "-DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES=$ma")
[ "$hide" = 0 ] || args+=("-DCMAKE_IGNORE_PREFIX_PATH=/usr;/")
# A node without make: ninja (pip's, the node's, or the kit's --with-toolchain).
if [ ! -f "$build/CMakeCache.txt" ] && ! command -v make >/dev/null; then
  command -v ninja >/dev/null || die "neither make nor ninja on PATH"
  args+=(-G Ninja)
fi
t0=$SECONDS
cmake -S "$src" -B "$build" "${args[@]}" >"$prefix/cmake-configure.log" 2>&1 ||
  { tail -40 "$prefix/cmake-configure.log" >&2; die "cmake configure failed (log: $prefix/cmake-configure.log)"; }
grep -E 'memtrain CUDA build|Found MPI_C|Found HDF5' "$prefix/cmake-configure.log" || true
tgt=()
[ -z "$targets" ] || tgt=(--target ${targets//,/ })
cmake --build "$build" -j"${MEMTRAIN_BUILD_JOBS:-$(nproc)}" "${tgt[@]}" >"$prefix/cmake-build.log" 2>&1 ||
  { tail -40 "$prefix/cmake-build.log" >&2; die "build failed (log: $prefix/cmake-build.log)"; }
say "configured and built ${targets:-every target} in $((SECONDS - t0)) s into $build"

# 6. memtrain links the kit's MPI, HDF5, yaml-cpp, libpng and libjpeg.
for lib in libmpi.so libhdf5_serial.so libyaml-cpp.so libpng16.so libjpeg.so; do
  at=$(ldd "$build/memtrain" | awk -v l="$lib" 'index($1, l) == 1 {print $3}')
  case "$at" in "$prefix"/*) say "memtrain: $lib -> $at" ;; *) die "memtrain loads $lib from ${at:-nowhere}, not from $prefix" ;; esac
done
timeout 120 "$MEMTRAIN_MPIEXEC" --oversubscribe -np 2 "$build/memtrain" --version >/dev/null 2>&1 ||
  timeout 120 "$MEMTRAIN_MPIEXEC" --oversubscribe -np 2 "$build/memtrain" --help >/dev/null ||
  die "mpiexec -np 2 memtrain --help failed"
say "done in $((SECONDS - start)) s; next: source $prefix/env.sh; bash tests/gpu/run.sh --prefix $prefix"
