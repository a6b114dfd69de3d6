# For the node-lost tests (sourced, after MEMTRAIN, MPIEXEC and fail; the
# last two also after cluster.env): lost_run_setup DIR writes DIR/train.h5
# and DIR/cfg.yaml (4096 samples, 8 epochs of 32 windows, effective batch
# 128, a checkpoint every 16 windows, dist.timeout_s 10) and runs it
# uninterrupted on 2 ranks into DIR/full (another world size gives the
# same losses within 1e-5); none_left NODE; newest_whole DIR.
lost_run_setup() {
  local dir=$1
  "$MEMTRAIN" make-data --kind features --out "$dir/train.h5" --samples 4096 --features 64 --classes 4 >/dev/null ||
    fail make-data
  cat >"$dir/cfg.yaml" <<CFG
data:
  train: $dir/train.h5
  val: ""
  batch_size: 16
model:
  hidden: 128
training:
  epochs: 8
  effective_batch_size: 128
  checkpoint_every: 16
  keep_checkpoints: 3
dist:
  timeout_s: 10
CFG
  "$MPIEXEC" --oversubscribe -np 2 "$MEMTRAIN" train --config "$dir/cfg.yaml" --output.dir="$dir/full" >full.log 2>&1 ||
    { tail -20 full.log; fail "the uninterrupted run"; }
}

# No process left on NODE of the cluster in cluster.env (its namespace
# holder aside, and those whose command line matches EXCEPT, e.g.
# "^slurmd "); waits up to 60 s for what is ending.
none_left() {
  local node=$1 except=${2:-} ns=${MT_TAG}n${1#node} holder left
  ip netns list | grep -q "^$ns\b" || fail "$node's namespace is gone: nothing to check on it"
  holder=$(cat "$MT_CLUSTER/ns/$node.pid")
  for _ in $(seq 600); do
    left=$(ip netns pids "$ns" | grep -vx "$holder" | xargs -r ps -o args= -p |
      { if [ -n "$except" ]; then grep -Ev "$except"; else cat; fi; } || true)
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  fail "processes left on $node: $left"
}

# The newest checkpoint of DIR/checkpoints is whole (exported, its checksum
# checked) and no partial file lies beside it.
newest_whole() {
  local dir=$1 newest
  newest=$(ls "$dir/checkpoints/"ckpt-*.safetensors | sort | tail -1)
  "$MEMTRAIN" export --checkpoint "$newest" --out "$(basename "$dir")-export.safetensors" >export.log 2>&1 ||
    { cat export.log; fail "$dir: the newest checkpoint $newest is not whole"; }
  ! ls "$dir/checkpoints/" | grep -v '^ckpt-[0-9]*\.safetensors$' || fail "$dir: a partial file in checkpoints/"
  echo "$(basename "$dir"): the newest checkpoint, $(basename "$newest"), verified by memtrain export"
}
