# Sourced by the multi-node tests after they set MEMTRAIN, MPIEXEC, PY and
# WORK: fail, a fresh WORK (a cluster an earlier killed run left there
# removed first) as the current folder, launch/env.sh, and
# start_cluster N: N nodes of cluster.sh in WORK/cluster, removed on exit
# (exit 77, the reason printed, where namespaces cannot be made), its
# cluster.env sourced; S is the nodes' shared folder.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
fail() {
  echo "FAIL: $*"
  exit 1
}
C=$WORK/cluster
[ -d "$C" ] && bash "$HERE/cluster.sh" down "$C"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
source "$REPO/launch/env.sh"

start_cluster() {
  local rc=0
  bash "$HERE/cluster.sh" up "$C" "$1" >up.log 2>&1 || rc=$?
  [ "$rc" = 77 ] && { cat up.log; exit 77; }
  trap 'bash "$HERE/cluster.sh" down "$C"' EXIT
  trap 'exit 130' INT TERM
  [ "$rc" = 0 ] || { cat up.log; fail "cluster.sh up: exit $rc"; }
  cat up.log
  source "$C/cluster.env"
  S=$MT_SHARED
}

# The cluster removed, and nothing of it left.
stop_cluster() {
  bash "$HERE/cluster.sh" down "$C"
  trap - EXIT
  bash "$HERE/cluster.sh" check "$C" || fail "the cluster was not removed"
  ! ip netns list | grep -q "^$MT_TAG" || fail "namespaces left: $(ip netns list)"
  echo "cluster removed: no namespace, bridge, veth, mount or process left"
}
