# The run that loses a node, for the node-lost tests (sourced, after
# MEMTRAIN, MPIEXEC and fail): lost_run_setup DIR writes DIR/train.h5 and
# DIR/cfg.yaml (4096 samples, 8 epochs of 32 windows, effective batch 128,
# a checkpoint every 16 windows, dist.timeout_s 10) and runs it
# uninterrupted on 2 ranks into DIR/full (another world size gives the
# same losses within 1e-5).
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
