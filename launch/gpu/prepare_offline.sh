#!/usr/bin/env bash
# Puts into DIR the Debian (bookworm, amd64) packages that the CUDA build of
# memtrain needs on a GPU node without network: the Open MPI and HDF5
# runtimes and headers, yaml-cpp, CLI11, nlohmann-json, GoogleTest, nifti,
# libpng, libjpeg-turbo, ICU, zlib headers, and the shared libraries these load:
# every package whose library or headers CMakeLists.txt finds, except
# LibTorch (the node's torch wheel), CUDA (the node's toolkit) and what a
# compiling system has (rule 1 below). tests/gpu/hide_system.sh proves it:
# a build with every other library of the machine hidden. Run where Debian's
# registry is reachable; root is not needed (apt-get download, an empty
# dpkg status file for the dependency computations).
# usage: launch/gpu/prepare_offline.sh DIR [--with-toolchain]
#   --with-toolchain  also cmake, make and ninja (and their libraries), for a
#                     node that has a C++ compiler but no cmake; not g++:
#                     a compiler does not run from an unpacked folder
# Writes DIR/debs/*.deb and DIR/MANIFEST (package, version, sha256, bytes),
# DIR/tools/*.deb and DIR/TOOLS (the same for the tools, below);
# prints the package count and total size. Then, on the GPU node:
#   bash launch/gpu/build_offline.sh DIR
#
# Which packages (the rule, computed, nothing listed by hand but the roots):
#  1. base = the dependency closure of every package of Priority required or
#     important or Essential, and of build-essential: what a Debian-like node
#     that can compile surely has (libc6, libstdc++6, zlib1g, libssl3, ...).
#  2. candidates = the Depends/Pre-Depends closure of ROOTS, minus base.
#  3. the kit = ROOTS, then every candidate that a package already in the kit
#     needs at run or link time: one that provides a shared library an ELF
#     file of the kit names as NEEDED (Open MPI's and PMIx's plugins
#     included), or the target of one of its symbolic links (a -dev
#     package's libX.so -> the runtime's libX.so.N). Candidates reached only
#     through Depends are left out: autotools, gfortran, openssh-client
#     (mpirun's remote start; one node needs none), hwloc's X11/ICU plugins,
#     the -dev packages of HDF5's static link (curl, ssl, aec; jpeg is a
#     root for memtrain itself), javascript.
#  4. check: every NEEDED library of the kit is in the kit or in base.
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
usage="usage: $0 DIR [--with-toolchain]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
dir=$1
shift
toolchain=0
for a in "$@"; do
  case "$a" in
    --with-toolchain) toolchain=1 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for tool in apt-get apt-cache dpkg-deb readelf sha256sum; do
  command -v "$tool" >/dev/null ||
    { echo "prepare_offline.sh: needs $tool (a Debian system with binutils)" >&2; exit 1; }
done
arch=$(dpkg --print-architecture)
[ "$arch" = amd64 ] || { echo "prepare_offline.sh: made for amd64 nodes; this system is $arch" >&2; exit 1; }
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
[ "$codename" = bookworm ] ||
  echo "prepare_offline.sh: warning: made and tested on Debian bookworm; this is $codename" >&2

# What CMakeLists.txt and tests/CMakeLists.txt find (find_package,
# find_library, find_path) besides Torch, CUDA, Threads and Python: MPI, HDF5,
# yaml-cpp, nlohmann_json, CLI11, GTest, nifti2 + znz, ZLIB, PNG, JPEG, ICU.
# libjpeg62-turbo-dev, not libjpeg-dev: that one only depends on it.
ROOTS=(libopenmpi-dev openmpi-bin openmpi-common libhdf5-dev hdf5-helpers libyaml-cpp-dev
       libcli11-dev nlohmann-json3-dev libgtest-dev libnifti2-dev libniftiio-dev
       libznz-dev zlib1g-dev libpng-dev libjpeg62-turbo-dev libicu-dev)
[ "$toolchain" = 0 ] || ROOTS+=(cmake cmake-data make ninja-build)

mkdir -p "$dir/debs"
dir=$(cd "$dir" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/status"
debian_base "$work" >"$work/base" ||
  { echo "prepare_offline.sh: cannot compute the base system (apt-get -s failed)" >&2; exit 1; }
apt_closure "$work" "${ROOTS[@]}" >"$work/closure" ||
  { echo "prepare_offline.sh: apt-get -s cannot install ${ROOTS[*]} (apt-get update?)" >&2; exit 1; }
[ -s "$work/closure" ] || { echo "prepare_offline.sh: no closure for ${ROOTS[*]}" >&2; exit 1; }
comm -23 "$work/closure" "$work/base" >"$work/candidates"
echo "prepare_offline.sh: $(wc -l <"$work/candidates") candidates (closure $(wc -l <"$work/closure"), base $(wc -l <"$work/base"))"

mkdir -p "$work/cand" "$work/x"
(cd "$work/cand" && xargs -a "$work/candidates" apt-get download -q -q >/dev/null 2>"$work/dl.err") ||
  { cat "$work/dl.err" >&2; echo "prepare_offline.sh: apt-get download failed (network? apt-get update?)" >&2; exit 1; }
# index_debs DEBS OUT: unpacks DEBS/*.deb into OUT/x/PACKAGE and writes the
# indexes OUT/debfile (package, .deb), OUT/files (package, path) and
# OUT/sonames (SONAME, package, library file).
index_debs() {
  local deb p f s
  : >"$2/debfile"
  : >"$2/files"
  : >"$2/sonames"
  for deb in "$1"/*.deb; do
    p=$(dpkg-deb -f "$deb" Package)
    echo "$p $(basename "$deb")" >>"$2/debfile"
    dpkg-deb -x "$deb" "$2/x/$p"
    (cd "$2/x/$p" && find . \( -type f -o -type l \) | sed "s|^\.|$p |") >>"$2/files"
    find "$2/x/$p" -type f -name '*.so*' | while read -r f; do
      s=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
      [ -z "$s" ] || echo "$s $p $f"
    done >>"$2/sonames"
  done
}
index_debs "$work/cand" "$work"
owner_of_path() { awk -v f="$1" '$2 == f {print $1; exit}' "$work/files"; }
needed_of() {  # PKG -> the NEEDED sonames of its ELF files
  find "$work/x/$1" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    xargs -0 -r readelf -d 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u
}
declare -A kit=()
queue=()
for p in "${ROOTS[@]}"; do
  grep -qx "$p" "$work/candidates" && { kit[$p]=1; queue+=("$p"); }
done
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  deps=()
  while read -r s; do
    q=$(awk -v s="$s" '$1 == s {print $2; exit}' "$work/sonames")
    [ -z "$q" ] || deps+=("$q")
  done < <(needed_of "$p")
  while read -r l; do
    t=$(readlink "$work/x/$p/$l")
    case "$t" in /*) ;; *) t=$(realpath -m --relative-to=/ "/$(dirname "$l")/$t") ;; esac
    q=$(owner_of_path "/${t#/}")
    [ -z "$q" ] || deps+=("$q")
  done < <(cd "$work/x/$p" && find . -type l ! -path "./usr/share/doc/*")
  for q in "${deps[@]}"; do
    [ -n "${kit[$q]:-}" ] || { kit[$q]=1; queue+=("$q"); }
  done
done

# Check: each NEEDED soname of the kit is in the kit or in base.
missing=()
for p in "${!kit[@]}"; do
  while read -r s; do
    q=$(awk -v s="$s" '$1 == s {print $2; exit}' "$work/sonames")
    if [ -n "$q" ]; then
      [ -n "${kit[$q]:-}" ] || missing+=("$s (needed by $p, in $q, not in the kit)")
    else
      path=$(ldconfig -p | awk -v s="$s" '$1 == s && !f {print $NF; f = 1}')
      owner=
      for f in "$path" "/usr$path" "${path#/usr}"; do
        [ -n "$owner" ] || [ -z "$path" ] ||
          owner=$(dpkg -S "$f" 2>/dev/null | awk -F: 'NR == 1 {print $1}' || true)
      done
      if [ -z "$owner" ] || ! grep -qx "$owner" "$work/base"; then
        missing+=("$s (needed by $p; found here in ${owner:-nothing}, not in base)")
      fi
    fi
  done < <(needed_of "$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  printf 'prepare_offline.sh: not covered: %s\n' "${missing[@]}" >&2
  exit 1
fi

# The newest glibc and libstdc++ symbol versions the kit's binaries use: the
# node must have at least these (build_offline.sh checks).
newest() {  # PATTERN -> the newest symbol version of it the kit's ELF files use
  for p in "${!kit[@]}"; do
    find "$work/x/$p" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
      xargs -0 -r readelf -V 2>/dev/null | grep -o "$1" || true
  done | sort -uV | tail -1
}
glibc=$(newest 'GLIBC_2\.[0-9]*')
glibcxx=$(newest 'GLIBCXX_3\.4\.[0-9]*')
rm -f "$dir"/debs/*.deb
{
  echo "# memtrain offline kit: made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $codename/$arch by launch/gpu/prepare_offline.sh"
  echo "# roots: ${ROOTS[*]}"
  echo "# needs-glibc: ${glibc#GLIBC_}"
  echo "# needs-glibcxx: ${glibcxx#GLIBCXX_}"
  echo "# package version sha256 bytes file"
  for p in $(printf '%s\n' "${!kit[@]}" | sort); do
    f=$(awk -v p="$p" '$1 == p {print $2; exit}' "$work/debfile")
    cp "$work/cand/$f" "$dir/debs/"
    echo "$p $(dpkg-deb -f "$dir/debs/$f" Version) $(sha256sum "$dir/debs/$f" | cut -d' ' -f1) $(stat -c %s "$dir/debs/$f") debs/$f"
  done
} >"$dir/MANIFEST"
# The tools (DIR/TOOLS, DIR/tools/*.deb): programs the GPU proof's
# two-node part runs (tests/gpu/run.sh point h; tests/multinode/cluster.sh)
# that a node's image may lack although every Debian system has them:
# iproute2's ip. Each with the packages of the libraries it loads, libc6
# excepted (the node's); build_offline.sh unpacks them apart from the kit
# and runs each through the loader with their own library folders, so they
# never shadow a library of the node's.
TOOLS=("iproute2 bin/ip")
progs=()
mkdir -p "$work/t/x" "$dir/tools"
rm -f "$dir"/tools/*.deb
for t in "${TOOLS[@]}"; do
  read -r pkg prog <<<"$t"
  apt_closure "$work/t" "$pkg" >"$work/t/closure" ||
    { echo "prepare_offline.sh: apt-get -s cannot install $pkg" >&2; exit 1; }
  (cd "$work/t" && xargs -a closure apt-get download -q -q >/dev/null 2>dl.err) ||
    { cat "$work/t/dl.err" >&2; echo "prepare_offline.sh: apt-get download $pkg's closure failed" >&2; exit 1; }
  index_debs "$work/t" "$work/t"
  [ -f "$work/t/x/$pkg/$prog" ] || { echo "prepare_offline.sh: $pkg has no $prog" >&2; exit 1; }
  # The program, then each library it loads (by SONAME, libc6's excepted).
  declare -A tool=([$pkg]=1)
  files=("$work/t/x/$pkg/$prog")
  while [ ${#files[@]} -gt 0 ]; do
    f=${files[0]}
    files=("${files[@]:1}")
    while read -r s; do
      read -r q lib < <(awk -v s="$s" '$1 == s {print $2, $3; exit}' "$work/t/sonames")
      [ -n "$q" ] || { echo "prepare_offline.sh: $prog needs $s, which no package of $pkg's closure has" >&2; exit 1; }
      [ "$q" != libc6 ] && [ -z "${tool[$lib]:-}" ] || continue
      tool[$lib]=1 tool[$q]=1
      files+=("$lib")
    done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  done
  for q in "${!tool[@]}"; do
    [ "${q#/}" = "$q" ] || continue  # the library files, not packages
    f=$(awk -v p="$q" '$1 == p {print $2; exit}' "$work/t/debfile")
    cp "$work/t/$f" "$dir/tools/"
    echo "$q $(dpkg-deb -f "$dir/tools/$f" Version) $(sha256sum "$dir/tools/$f" | cut -d' ' -f1) $(stat -c %s "$dir/tools/$f") tools/$f"
  done | sort >>"$work/tools-manifest"
  progs+=("/$prog")
  unset tool
done
{
  echo "# memtrain offline kit's tools: made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $codename/$arch by launch/gpu/prepare_offline.sh"
  echo "# programs: ${progs[*]}"
  echo "# package version sha256 bytes file"
  sort -u "$work/tools-manifest"
} >"$dir/TOOLS"
n=$(grep -vc '^#' "$dir/MANIFEST")
bytes=$(awk '!/^#/{s += $4} END {print s}' "$dir/MANIFEST")
echo "prepare_offline.sh: $n packages, $bytes bytes ($(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB) in $dir/debs; needs glibc >= ${glibc#GLIBC_}, libstdc++ GLIBCXX >= ${glibcxx#GLIBCXX_}"
echo "prepare_offline.sh: tools: $(grep -vc '^#' "$dir/TOOLS") packages for ${progs[*]} in $dir/tools"
echo "prepare_offline.sh: on the GPU node: bash launch/gpu/build_offline.sh $dir"
