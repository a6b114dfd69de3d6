#!/usr/bin/env bash
# Rehearses here, on a machine without a GPU, the GPU node's calls exactly
# as the device tool makes them: a fresh folder holding what the tool sends
# (the git working tree: tracked and untracked-but-not-ignored files, plus
# the bundle as a carried path), every library of this machine a GPU node
# is not known to have hidden (tests/gpu/hide_system.sh; iproute2 too: an
# image may have no ip, and point h must then use the kit's), python3 the one
# that holds torch, pip's cmake and ninja instead of Debian's (--path); then
# the calls of tests/gpu/README.md in CPU mode, each timed:
#   1. probe.sh, then run.sh --bundle --cpu --points a,c (with the tests)
#   2. probe.sh, then run.sh --bundle --cpu --points b,d,e,h --no-ctest
#   3. (--fallback) the bundle's BUNDLE.info made to name another torch:
#      run.sh must say so and build with launch/gpu/build_offline.sh from
#      the bundle's kit (every library hidden: point 3 of issue 24), then
#      run point (e) with what it built
# usage: tests/gpu/rehearse.sh [--bundle DIR] [--venv V] [--path DIR]
#                              [--work DIR] [--fallback] [--only 1,2,3]
#   --bundle  default gpu-bundle (launch/gpu/bundle.sh)
#   --venv    the venv whose python3 holds torch (default /opt/memtrain/torch-venv)
#   --path    a folder with pip's cmake, ctest and ninja (default
#             /tmp/memtrain-gpu-tools/path; made with pip when missing)
#   --work    where the fresh folder goes (default a new /tmp/memtrain-rehearsal.*)
# Writes WORK/rehearsal.md: each call's command, exit status and time, and
# the reports. Needs root (the mount namespace).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/launch/gpu/lib.sh"
usage="usage: $0 [--bundle DIR] [--venv V] [--path DIR] [--work DIR] [--fallback] [--only 1,2,3]"
bundle=$src/gpu-bundle venv=/opt/memtrain/torch-venv tools=/tmp/memtrain-gpu-tools/path work= fallback=0 only=1,2
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle | --venv | --path | --work | --only)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      case "$1" in --bundle) bundle=$2 ;; --venv) venv=$2 ;; --path) tools=$2 ;; --work) work=$2 ;; --only) only=$2 ;; esac
      shift 2 ;;
    --fallback) fallback=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ "$fallback" = 0 ] || [[ ",$only," == *,3,* ]] || only=$only,3
bundle=$(cd "$bundle" 2>/dev/null && pwd) || die "no bundle at $bundle: bash launch/gpu/bundle.sh first"
[ -f "$bundle/BUNDLE.info" ] || die "$bundle is not a bundle (no BUNDLE.info)"
[ -x "$venv/bin/python3" ] || die "no $venv/bin/python3 (bash launch/install_torch.sh)"
if [ ! -x "$tools/cmake" ]; then
  say "no pip cmake at $tools: installing cmake and ninja from PyPI into $(dirname "$tools")"
  /usr/bin/python3 -m venv "$(dirname "$tools")"
  "$(dirname "$tools")/bin/pip" install -q cmake ninja
  mkdir -p "$tools"
  for t in cmake ctest cpack ninja; do ln -sfn "../bin/$t" "$tools/$t"; done
fi
work=${work:-$(mktemp -d /tmp/memtrain-rehearsal.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
tree=$work/memtrain
rm -rf "$tree"
mkdir -p "$tree"
# What the device tool sends: the working tree git does not ignore, and the
# carried bundle (without an unpacked prefix left from an earlier run).
t0=$SECONDS
(cd "$src" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$tree" 2>/dev/null || true)
rm -rf "$tree/gpu-bundle"
cp -r "$bundle" "$tree/gpu-bundle"
rm -rf "$tree/gpu-bundle/prefix"
say "fresh folder $tree: $(du -sh "$tree" | cut -f1) ($((SECONDS - t0)) s)"
R=$work/rehearsal.md
{
  echo "# GPU calls rehearsed in CPU mode, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), $(nproc) cores"
  echo
  echo "Bundle: $(bundle_get "$bundle" built)"
  echo
  echo "| call | command | exit | time |"
  echo "| --- | --- | --- | --- |"
} >"$R"
call() {  # N COMMAND: one call, as on the node, hidden; logged and timed
  local n=$1 cmd=$2 rc=0 t0=$SECONDS
  say "call $n: $cmd"
  bash "$src/tests/gpu/hide_system.sh" --path "$tools" --hide iproute2 \
    bash -c "export PATH=$venv/bin:\$PATH; cd $tree && $cmd" >"$work/call$n.log" 2>&1 || rc=$?
  echo "| $n | \`$cmd\` | $rc | $((SECONDS - t0)) s |" >>"$R"
  say "call $n: exit $rc, $((SECONDS - t0)) s (log $work/call$n.log)"
}
if [[ ",$only," == *,1,* ]]; then
  call 1 "bash tests/gpu/probe.sh --bundle gpu-bundle && bash tests/gpu/run.sh --bundle gpu-bundle --cpu --points a,c --out runs/gpu-1"
fi
if [[ ",$only," == *,2,* ]]; then
  call 2 "bash tests/gpu/probe.sh --bundle gpu-bundle && bash tests/gpu/run.sh --bundle gpu-bundle --cpu --points b,d,e,h --no-ctest --out runs/gpu-2"
fi
if [[ ",$only," == *,3,* ]]; then
  # Another torch than the bundle's: the executables must not be used.
  sed -i 's/^torch_version .*/torch_version 0.0.0-rehearsal/' "$tree/gpu-bundle/BUNDLE.info"
  (cd "$tree/gpu-bundle" && sed -i '/  BUNDLE.info$/d' SHA256SUMS && sha256sum BUNDLE.info >>SHA256SUMS)
  call 3 "bash tests/gpu/run.sh --bundle gpu-bundle --cpu --points e --no-ctest --out runs/gpu-3"
fi
{
  echo
  for f in "$tree"/runs/gpu-*/gpu-report.md; do
    [ -f "$f" ] || continue
    echo "## $(basename "$(dirname "$f")")"
    echo
    sed -n '/^| point | result/,/^$/p; /^| part | time/,/^$/p' "$f"
  done
} >>"$R"
cat "$R"
