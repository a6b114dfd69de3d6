#!/usr/bin/env bash
# memtrain vs PyTorch DistributedDataParallel: the same models, HDF5 file,
# initial parameters, sample order, effective batch, accumulation, optimizer,
# precision (fp32) and threads per rank; memtrain under mpirun, then the
# PyTorch script (benchmarks/vs_pytorch/pytorch_ddp.py) under mpirun, in
# alternation, R repeats of N windows each. Prints a table, writes
# DIR/vs_pytorch.csv and DIR/vs_pytorch.png (gnuplot).
#
# usage: benchmarks/vs_pytorch/run.sh [--device cpu|cuda]
#          [--models mlp,cnn,unet3d,seresnext50_32x4d,swin_unetr,clip,fsct]
#          [--windows N] [--repeats R] --out DIR [--memtrain PATH] [--np 2]
#          [--size full|smallest|gpu] [--warmup W] [--check-loss TOL]
#          [--compute-floor on|off] [--budget off|on|both] [--budget-bytes B]
#          [--run-limit S]
#   --size smallest   seconds-long sizes (CI); full: the sizes in README.md
#   --warmup W        windows left out of the timing at the start of each run (1)
#   --check-loss TOL  exit 1 when the losses after N windows differ by more
#                     than TOL relative (a correctness check, not a figure)
#   --compute-floor   on (default): after each PyTorch run, the same windows'
#                     forward and backward alone, every rank at once (no
#                     all-reduce, no step): the compute any trainer of these
#                     kernels needs here, reported beside both windows
#   --budget          off (default): memtrain with memory.budget=none; on: with
#                     memory.budget (a rank's share of this machine, as a
#                     V100's 16 GB is a GPU rank's: --budget-bytes, default
#                     80% of MemTotal over the ranks) and
#                     training.gradient_checkpointing=auto, what the shipped
#                     *-v100.yaml files run; both: each model twice, its rows
#                     named MODEL and MODEL+budget. The micro-batch is the
#                     race's on both sides either way.
#   --run-limit S     a run (one side, one repeat) still going after S seconds
#                     is stopped and the race fails naming it, with the PyTorch
#                     side's Python stacks in its log (0, the default: no limit)
# Environment: PYTHON (a python3 with torch, h5py and numpy, and the peer's
# framework for its model: timm for seresnext50_32x4d and fsct's ResNet-50,
# MONAI for swin_unetr, open_clip for clip; default: the first of python3, /usr/bin/python3 that
# has torch, h5py and numpy), MPIEXEC (mpirun). For the race on LibTorch
# 2.11: --memtrain build-cuda/memtrain (the torch-2.11 configuration runs on
# the CPU too) and PYTHON=/opt/memtrain/torch-venv/bin/python (launch/
# install_peers.sh, which runs install_torch.sh, puts torch 2.11, timm,
# MONAI and open_clip there), the same kernels on both sides.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
usage="usage: $0 [--device cpu|cuda] [--models mlp,cnn,unet3d,seresnext50_32x4d,swin_unetr,clip,fsct] [--windows N] [--repeats R] --out DIR [--memtrain PATH] [--np 2] [--size full|smallest|gpu] [--warmup W] [--check-loss TOL] [--compute-floor on|off] [--budget off|on|both] [--budget-bytes B] [--run-limit S]"
device=cpu models=mlp,cnn,unet3d windows=10 repeats=3 out="" memtrain="$root/build/memtrain"
np=2 size=full warmup=1 check="" floor=on budget=off budget_bytes="" limit=0
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
  case "$1" in
    --device) device=$2 ;;
    --models) models=$2 ;;
    --windows) windows=$2 ;;
    --repeats) repeats=$2 ;;
    --out) out=$2 ;;
    --memtrain) memtrain=$2 ;;
    --np) np=$2 ;;
    --size) size=$2 ;;
    --warmup) warmup=$2 ;;
    --check-loss) check=$2 ;;
    --compute-floor) floor=$2 ;;
    --budget) budget=$2 ;;
    --budget-bytes) budget_bytes=$2 ;;
    --run-limit) limit=$2 ;;
    *) echo "$0: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$out" ] || { echo "$0: --out DIR is required" >&2; echo "$usage" >&2; exit 2; }
case "$device" in cpu | cuda) ;; *) echo "$0: --device must be cpu or cuda, got '$device'" >&2; exit 2 ;; esac
case "$floor" in on | off) ;; *) echo "$0: --compute-floor must be on or off, got '$floor'" >&2; exit 2 ;; esac
case "$size" in full | smallest | gpu) ;; *) echo "$0: --size must be full, smallest or gpu, got '$size'" >&2; exit 2 ;; esac
case "$budget" in off) budgets=(off) ;; on) budgets=(on) ;; both) budgets=(off on) ;;
  *) echo "$0: --budget must be off, on or both, got '$budget'" >&2; exit 2 ;; esac
for v in windows repeats np warmup limit; do
  [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -ge 1 -o "$v" = warmup -o "$v" = limit ] ||
    { echo "$0: --${v/limit/run-limit} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[ "$warmup" -lt "$windows" ] ||
  { echo "$0: --warmup $warmup leaves no timed window of --windows $windows" >&2; exit 2; }
if [ -z "$budget_bytes" ]; then
  mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  budget_bytes=$((mem_kib * 1024 * 8 / 10 / np / 1048576 * 1048576))
fi
[[ $budget_bytes =~ ^[0-9]+$ ]] && [ "$budget_bytes" -gt 0 ] ||
  { echo "$0: --budget-bytes must be a positive number of bytes, got '$budget_bytes'" >&2; exit 2; }
[ -x "$memtrain" ] ||
  { echo "$0: memtrain binary '$memtrain' not found: build it (bash launch/build.sh) or pass --memtrain PATH" >&2; exit 2; }
memtrain=$(cd "$(dirname "$memtrain")" && pwd)/$(basename "$memtrain")

# A python3 with torch, h5py and numpy (Debian: python3-torch python3-h5py).
has_deps() { "$1" -c 'import torch, h5py, numpy' >/dev/null 2>&1; }
if [ -n "${PYTHON:-}" ]; then
  has_deps "$PYTHON" || { echo "$0: PYTHON=$PYTHON cannot import torch, h5py and numpy" >&2; exit 2; }
  py=$PYTHON
else
  py=""
  for c in python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null && has_deps "$c"; then py=$(command -v "$c"); break; fi
  done
  [ -n "$py" ] || { echo "$0: no python3 with torch, h5py and numpy (apt-get install python3-torch python3-h5py, or set PYTHON)" >&2; exit 2; }
fi
source "$root/launch/env.sh"
mpiexec=${MPIEXEC:-mpirun}
command -v "$mpiexec" >/dev/null || { echo "$0: $mpiexec not found (set MPIEXEC)" >&2; exit 2; }

mkdir -p "$out/data"
out=$(cd "$out" && pwd)
: >"$out/commands.txt"
log() { echo "$*" >>"$out/commands.txt"; }

# Per model and size: data, model and window shape. B = np x accum x micro.
# full: the MLP's matrix products dominate (hidden 1024, 4x wide inside);
# smallest: seconds in all, for CI.
set_model() {  # MODEL
  local m=$1
  opt=sgd lr=0.01 momentum=0.9 wd=0 accum=2 clip=0
  # The seeds' models train as their launch/configs/*-v100.yaml do (AdamW,
  # its learning rate and weight decay; CLIP's clipping at 1.0), in fp32.
  case $m in
    swin_unetr) opt=adamw lr=0.0001 momentum=0 wd=0.00001 ;;
    clip) opt=adamw lr=0.00001 momentum=0 wd=0.1 clip=1.0 accum=1 ;;
    fsct) opt=adamw lr=0.001 momentum=0 ;;
  esac
  if [ "$size" = gpu ] && [ "$m" = unet3d ]; then
    # A GPU-sized U-Net (the 16 GB scenario's patch, a narrower width so that
    # fp32 fits a V100's budget): 96^3 patches of 128^3 volumes, feature 32.
    data=(--kind volumes --channels 1 --depth 128 --height 128 --width 128 --classes 3 --chunk 32)
    feat=32 depth=3 patch=96 micro=2 vols=4
  elif [ "$size" = full ] || [ "$size" = gpu ]; then
    case $m in
      mlp) data=(--kind features --features 512 --classes 10); hidden=1024 depth=2 micro=64 lr=0.02 ;;
      cnn) data=(--kind images --channels 3 --height 32 --width 32 --classes 10); hidden=32 depth=3 micro=32 lr=0.02 ;;
      unet3d) data=(--kind volumes --channels 1 --depth 48 --height 48 --width 48 --classes 3 --chunk 16)
        feat=8 depth=3 patch=32 micro=2 vols=4 ;;
      # timm's SE-ResNeXt50 at ImageNet's 224^2, a small batch.
      seresnext50_32x4d) data=(--kind images --channels 3 --height 224 --width 224 --classes 10); micro=2 ;;
      # MONAI's SwinUNETR at its tutorials' feature size 48 on whole 64^3
      # volumes as patches (96^3 does not leave two ranks room here).
      swin_unetr) data=(--kind volumes --channels 1 --depth 64 --height 64 --width 64 --classes 3 --chunk 32)
        feat=48 patch=64 micro=1 vols=4 ;;
      # open_clip's ViT-B-32 at 224^2 and 77 tokens, one contrastive batch
      # of 16 pairs a rank (32 at 2 ranks) a window.
      clip) data=(--kind captions --height 224 --width 224); variant=ViT-B-32 micro=16 ;;
      # FS-CT on a ResNet-50 as fewshot-v100.yaml: 5-way 5-shot episodes
      # of 16 queries a class (105 images of 84^2), one a micro-step.
      fsct) data=(--kind images --channels 3 --height 84 --width 84 --classes 8 --samples 384)
        way=5 shot=5 query=16 micro=1 ;;
    esac
  else
    case $m in
      mlp) data=(--kind features --features 16 --classes 4); hidden=32 depth=1 micro=4 ;;
      cnn) data=(--kind images --channels 1 --height 8 --width 8 --classes 4); hidden=4 depth=2 micro=4 ;;
      unet3d) data=(--kind volumes --channels 1 --depth 16 --height 16 --width 16 --classes 2 --chunk 8)
        feat=4 depth=2 patch=8 micro=1 vols=2 ;;
      seresnext50_32x4d) data=(--kind images --channels 3 --height 32 --width 32 --classes 4); micro=2 ;;
      swin_unetr) data=(--kind volumes --channels 1 --depth 64 --height 32 --width 32 --classes 2 --chunk 16)
        feat=12 patch=64,32,32 micro=1 vols=2 ;;
      clip) data=(--kind captions --height 32 --width 32); variant=tiny micro=4 ;;
      fsct) data=(--kind images --channels 3 --height 40 --width 40 --classes 8 --samples 96)
        way=3 shot=1 query=2 micro=1 ;;
    esac
  fi
  batch=$((np * accum * micro))
  local need=$((windows * batch))
  model_args=(--model.name=$m)
  py_args=(--model "$m")
  if [ "$m" = seresnext50_32x4d ]; then
    # The images as they are on both sides: no crop, flip or ImageNet
    # normalisation (what auto gives a ResNet).
    data+=(--samples "$need")
    model_args+=(--data.augment=none --data.normalize=none)
    return
  fi
  if [ "$m" = fsct ]; then
    # A sample is an episode; the class split holds out 2 of the 8 classes.
    model_args=(--model.name=resnet50 --model.head=cosine_transformer --model.embed_dim=512
      --data.episodes.n_way=$way --data.episodes.k_shot=$shot --data.episodes.n_query=$query
      --data.episodes.per_epoch=$need --data.val_classes=0.25 --validation.episodes=0
      --data.augment=none --data.normalize=none)
    py_args+=(--episodes "$way" "$shot" "$query" "$need" --val-classes 0.25 --embed-dim 512)
    return
  fi
  if [ "$m" = clip ]; then
    data+=(--samples "$need")
    model_args+=(--model.variant=$variant)
    py_args+=(--variant "$variant")
    return
  fi
  if [ "$m" = unet3d ] || [ "$m" = swin_unetr ]; then
    local p3
    IFS=, read -r -a p3 <<<"$patch"
    [ ${#p3[@]} = 3 ] || p3=("$patch" "$patch" "$patch")
    ppv=$(((need + vols - 1) / vols))
    data+=(--samples "$vols")
    model_args+=(--model.feature_size=$feat --model.norm=instance
      "--data.patch_size=[${p3[0]},${p3[1]},${p3[2]}]"
      --data.patches_per_volume=$ppv --data.pos_fraction=0 --data.flip=none)
    py_args+=(--feature-size "$feat" --norm instance --patch "${p3[@]}"
      --patches-per-volume "$ppv")
    if [ "$m" = unet3d ]; then
      model_args+=(--model.depth=$depth)
      py_args+=(--depth "$depth")
    fi
  else
    data+=(--samples "$need")
    model_args+=(--model.hidden=$hidden)
    py_args+=(--hidden "$hidden")
  fi
}

# Runs one side's command (its log: LOG) within --run-limit; on failure the
# log's tail and what failed.
run_side() {  # WHAT LOG COMMAND...
  local what=$1 log=$2 rc=0
  shift 2
  if [ "$limit" -gt 0 ]; then
    timeout --kill-after=20 "$limit" "$@" >"$log" 2>&1 || rc=$?
  else
    "$@" >"$log" 2>&1 || rc=$?
  fi
  [ "$rc" != 0 ] || return 0
  if [ "$limit" -gt 0 ] && { [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then
    tail -150 "$log" >&2  # every rank's stacks
    echo "$0: $what was still running after --run-limit $limit s and was stopped: a hang, or a machine much slower than this size expects ($log)" >&2
  else
    tail -40 "$log" >&2
    echo "$0: $what failed, exit $rc ($log)" >&2
  fi
  exit 1
}

IFS=, read -r -a model_list <<<"$models"
cases=()
for m in "${model_list[@]}"; do
  case "$m" in mlp | cnn | unet3d | seresnext50_32x4d | swin_unetr | clip | fsct) ;;
    *) echo "$0: unknown model '$m' (mlp, cnn, unet3d, seresnext50_32x4d, swin_unetr, clip, fsct)" >&2; exit 2 ;; esac
  peer=$(case $m in seresnext50_32x4d | fsct) echo timm ;; swin_unetr) echo monai ;; clip) echo open_clip ;; esac)
  if [ -n "$peer" ] && ! "$py" -c "import $peer" >/dev/null 2>&1; then
    echo "$0: $m is raced against $peer's own model, but $py cannot import $peer: set PYTHON to a python3 that has it (launch/install_peers.sh installs torch 2.11, timm, MONAI and open_clip in /opt/memtrain/torch-venv; with Debian's python3-torch: python3 -m venv --system-site-packages V; V/bin/pip install --no-deps $peer)" >&2
    exit 2
  fi
  for b in "${budgets[@]}"; do
    if [ "$b" = on ]; then cases+=("$m+budget"); else cases+=("$m"); fi
  done
done
for c in "${cases[@]}"; do
  m=${c%+budget}
  set_model "$m"
  budget_args=(--memory.budget=none)
  [ "$c" = "$m" ] || budget_args=(--memory.budget="$budget_bytes" --training.gradient_checkpointing=auto)
  h5="$out/data/$m-$size-w$windows-np$np.h5"
  if [ ! -s "$h5" ]; then
    "$memtrain" make-data "${data[@]}" --seed 7 --out "$h5" >/dev/null
  fi
  for r in $(seq 1 "$repeats"); do
    run="$out/runs/$c/r$r"
    rm -rf "$run"
    mkdir -p "$run"
    # memtrain first, then PyTorch from memtrain's initial parameters.
    cmd=("$mpiexec" -np "$np" "$py" "$here/peak_rss.py" "$run/memtrain/rss" --
      "$memtrain" train --data.train="$h5" --data.val= "${model_args[@]}"
      --model.seed=1234 --data.seed=0 --data.batch_size=$micro
      --training.gradient_accumulation_steps=$accum --training.epochs=1
      --training.max_windows=$windows --training.optimizer=$opt --training.lr=$lr
      --training.momentum=$momentum --training.weight_decay=$wd
      --training.grad_clip_norm=$clip --training.amp=off "${budget_args[@]}"
      --data.read_threads=1 --dist.device=$device --dist.check_replicas=off
      --output.dir="$run/memtrain" --output.save_initial=true --output.progress=lines)
    log "${cmd[*]}"
    echo "[$c r$r/$repeats] memtrain" >&2
    run_side "memtrain ($c, repeat $r)" "$run/memtrain.log" "${cmd[@]}"
    # The run's checkpoints (the model and its optimizer state, twice) are
    # not compared: left, those of 10 FS-CT and 5 SE-ResNeXt50 runs took
    # 3.7 GB and filled a nearly full disk.
    rm -rf "$run/memtrain/checkpoints"
    threads=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][0]["threads"])' "$run/memtrain/environment.json")
    mkdir -p "$run/pytorch"
    # The same threads per rank: LibTorch's (--threads), and OpenMP's and
    # OpenBLAS's pools, which read these at start-up. The ranks meet through
    # a file (a port picked here could be taken by the time they bind it).
    cmd=(env OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
      "$mpiexec" -np "$np" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$py" "$here/pytorch_ddp.py"
      --rendezvous "$run/pytorch/rendezvous"
      "${py_args[@]}" --data "$h5" --init "$run/memtrain/initial.safetensors"
      --data-seed 0 --micro $micro --accum $accum --windows $windows --optimizer $opt
      --lr $lr --momentum $momentum --weight-decay $wd --grad-clip $clip --threads "$threads" --device $device
      --out "$run/pytorch/result.json" --save "$run/pytorch/model.safetensors")
    [ "$floor" = off ] || cmd+=(--compute-floor)
    # Its stacks in its log before the limit stops it.
    [ "$limit" = 0 ] || cmd+=(--stacks-after $((limit > 30 ? limit - 10 : limit * 2 / 3)))
    log "${cmd[*]}"
    echo "[$c r$r/$repeats] pytorch (DDP, $threads thread(s) per rank)" >&2
    run_side "the PyTorch run ($c, repeat $r)" "$run/pytorch.log" "${cmd[@]}"
  done
done

sum_args=(--out "$out" --models "$(IFS=,; echo "${cases[*]}")" --repeats "$repeats" --windows "$windows"
  --warmup "$warmup" --device "$device" --size "$size" --np "$np" --memtrain "$memtrain"
  --mpiexec "$mpiexec")
[ -z "$check" ] || sum_args+=(--check-loss "$check")
"$py" "$here/summarize.py" "${sum_args[@]}"
