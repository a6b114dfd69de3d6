#!/usr/bin/env bash
# Runs COMMAND on this machine as a bare GPU node would see it: in a private
# mount namespace (unshare -m, root), every file of every installed Debian
# package is removed from view -- an overlay on /usr and one on /etc whose
# whiteouts hide them, so a library, header, CMake package or program that
# is hidden is not there at all -- except the packages a GPU node is known
# to have:
#   - the base system: the closure of Priority required/important/Essential
#     and build-essential (launch/gpu/lib.sh debian_base): libc, libstdc++,
#     zlib, gcc, g++, make, binutils, dpkg. The same rule that
#     launch/gpu/prepare_offline.sh leaves out of the kit, so anything else
#     a build or a run reaches for must come from the kit, or it fails.
#   - python3 (the node's Python; its torch is a pip wheel, outside /usr)
#   - ccache (a compiler cache: it changes no result, it spares minutes)
#   - the packages named with --keep,
# and hides the packages named with --hide even where the base system has
# them (iproute2: a GPU node's image may have no ip).
# Files no package installed stay as they are: /usr/local (the CUDA
# toolkit), /opt (the torch venv), /root, the source and build folders.
# Debian's cmake and ninja are hidden (a GPU node has pip's): put pip's
# first on PATH (--path DIR), or --keep cmake,cmake-data.
# The dynamic loader's cache is rebuilt inside. Nothing changes outside the
# namespace. Run as root; the command runs as root.
# usage: tests/gpu/hide_system.sh [--keep PKG,...] [--hide PKG,...] [--path DIR]
#                                 [--list FILE] COMMAND [ARGS...]
#   --list FILE  also write the hidden packages, one a line, to FILE
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: $0 [--keep PKG,...] [--hide PKG,...] [--path DIR] [--list FILE] COMMAND [ARGS...]"
if [ -z "${MEMTRAIN_HIDDEN:-}" ]; then
  keep=() hide=() path= list=
  while [ $# -gt 0 ]; do
    case "$1" in
      --keep | --hide | --path | --list)
        [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
        case "$1" in
          --keep) IFS=, read -r -a more <<<"$2"; keep+=("${more[@]}") ;;
          --hide) IFS=, read -r -a more <<<"$2"; hide+=("${more[@]}") ;;
          --path) path=$(cd "$2" 2>/dev/null && pwd) || { echo "hide_system.sh: --path $2: no such folder" >&2; exit 2; } ;;
          --list) list=$2 ;;
        esac
        shift 2 ;;
      --) shift; break ;;
      -*) echo "$usage" >&2; exit 2 ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "hide_system.sh: needs root (unshare -m, mount)" >&2; exit 1; }
  for tool in unshare mount apt-get dpkg-query /usr/bin/python3 ldconfig; do
    command -v "$tool" >/dev/null || { echo "hide_system.sh: needs $tool" >&2; exit 1; }
  done
  source "$here/../../launch/gpu/lib.sh"
  t0=$(date +%s.%N)
  work=$(mktemp -d /tmp/hide_system.XXXXXX)
  # The packages left visible: the base system and python3, ccache, --keep.
  debian_base "$work" >"$work/base" ||
    { rm -rf "$work"; echo "hide_system.sh: apt-get -s cannot compute the base system" >&2; exit 1; }
  apt_closure "$work" python3 ccache "${keep[@]}" >"$work/extra" ||
    { rm -rf "$work"; echo "hide_system.sh: apt-get -s cannot resolve: python3 ccache ${keep[*]}" >&2; exit 1; }
  sort -u "$work/base" "$work/extra" | grep -vxF -f <(printf '%s\n' "${hide[@]}" __none__) >"$work/keep" || true
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 ~ /^.i/ {print $2}' | sort -u >"$work/installed"
  comm -23 "$work/installed" "$work/keep" >"$work/hidden"
  [ -z "$list" ] || cp "$work/hidden" "$list"
  rc=0
  env MEMTRAIN_HIDDEN="$work" MEMTRAIN_HIDE_T0="$t0" MEMTRAIN_HIDE_PATH="$path" \
    MEMTRAIN_HIDE_KEEP="$(IFS=,; echo "${keep[*]}")" MEMTRAIN_HIDE_ALSO="$(IFS=,; echo "${hide[*]}")" unshare -m --propagation private bash "$0" "$@" || rc=$?
  rm -rf "$work"
  exit $rc
fi

# Inside the namespace: the overlays' upper layers on a tmpfs of their own.
work=$MEMTRAIN_HIDDEN
mkdir -p "$work/ovl"
mount -t tmpfs -o mode=0700 tmpfs "$work/ovl"
mkdir -p "$work/ovl/usr/up" "$work/ovl/usr/wk" "$work/ovl/etc/up" "$work/ovl/etc/wk"
# A whiteout (character device 0:0) in the upper layer for every file of a
# hidden package that no visible package also owns; paths through /lib,
# /bin, /sbin (links into /usr on a merged-/usr system) are resolved first.
n=$(/usr/bin/python3 - "$work" <<'EOF'
import os, stat, sys
work = sys.argv[1]
hidden = set(open(os.path.join(work, "hidden")).read().split())
installed = set(open(os.path.join(work, "installed")).read().split())
info = "/var/lib/dpkg/info"

def real(p):
    d, b = os.path.split(p)
    return os.path.join(os.path.realpath(d), b)

kept, hide = set(), set()
for f in os.listdir(info):
    if not f.endswith(".list"):
        continue
    pkg = f[:-5].split(":")[0]
    if pkg not in installed:
        continue
    target = hide if pkg in hidden else kept
    with open(os.path.join(info, f), errors="surrogateescape") as fh:
        for line in fh:
            p = line.rstrip("\n")
            if p.startswith("/") and p != "/.":
                target.add(real(p))
n = 0
for p in sorted(hide - kept):
    try:
        st = os.lstat(p)
    except OSError:
        continue
    if stat.S_ISDIR(st.st_mode):
        continue
    for root in ("/usr", "/etc"):
        if p.startswith(root + "/"):
            up = os.path.join(work, "ovl", root[1:], "up", p[len(root) + 1:])
            os.makedirs(os.path.dirname(up), exist_ok=True)
            os.mknod(up, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            n += 1
print(n)
EOF
)
for r in usr etc; do
  mount -t overlay overlay -o "lowerdir=/$r,upperdir=$work/ovl/$r/up,workdir=$work/ovl/$r/wk" "/$r" ||
    { echo "hide_system.sh: cannot mount an overlay on /$r (overlayfs missing from this kernel?)" >&2; exit 1; }
done
ldconfig  # the loader's cache, without the hidden libraries
[ -z "${MEMTRAIN_HIDE_PATH:-}" ] || export PATH="$MEMTRAIN_HIDE_PATH:$PATH"
secs=$(awk -v a="$MEMTRAIN_HIDE_T0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
echo "hide_system.sh: $(wc -l <"$work/hidden") of $(wc -l <"$work/installed") installed packages hidden ($n files; visible: the base system, python3, ccache${MEMTRAIN_HIDE_KEEP:+, $MEMTRAIN_HIDE_KEEP}${MEMTRAIN_HIDE_ALSO:+; hidden too: $MEMTRAIN_HIDE_ALSO}; ${secs} s) from: $*" >&2
unset MEMTRAIN_HIDDEN MEMTRAIN_HIDE_T0 MEMTRAIN_HIDE_PATH MEMTRAIN_HIDE_KEEP MEMTRAIN_HIDE_ALSO
exec "$@"
