#!/usr/bin/env bash
# Runs COMMAND with this machine's own copies of the kit's packages hidden:
# in a private mount namespace (unshare -m, root), every installed file of a
# package listed in KIT/MANIFEST is covered by /dev/null (libraries, headers,
# CMake files, mpirun, plugins), so a build or an mpiexec that still reached
# for /usr's Open MPI, PMIx, hwloc or HDF5 fails loudly. Nothing changes
# outside the namespace. A test of launch/gpu/build_offline.sh on a machine
# that has these packages installed (a GPU node without them needs none).
# usage: tests/gpu/hide_system.sh KIT COMMAND [ARGS...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 KIT COMMAND [ARGS...]" >&2; exit 2; }
kit=$1
shift
if [ -z "${MEMTRAIN_HIDDEN:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "hide_system.sh: needs root (unshare -m)" >&2; exit 1; }
  exec env MEMTRAIN_HIDDEN=1 unshare -m --propagation private bash "$0" "$kit" "$@"
fi
n=0
for p in $(awk '!/^#/{print $1}' "$kit/MANIFEST"); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || continue
  while read -r f; do
    case "$f" in /usr/share/doc/* | /usr/share/man/*) continue ;; esac
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    mount --bind /dev/null "$f" && n=$((n + 1))
  done < <(dpkg -L "$p")
done
echo "hide_system.sh: $n files of the kit's packages hidden from: $*" >&2
exec "$@"
