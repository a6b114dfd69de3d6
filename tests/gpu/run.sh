#!/usr/bin/env bash
# The GPU proof (issue 10): builds the CUDA configuration, runs every test on
# it, then the acceptance runs (a)-(g), and writes OUT/gpu-report.md with the
# versions, the date and every figure, each point PASS, FAIL or NOT RUN.
# usage: tests/gpu/run.sh [--kit DIR | --prefix P] [--cpu] [--out DIR]
#          [--build-dir B] [--cpu-build BIN] [--python PY] [--hide-system]
#   --kit DIR      build first with launch/gpu/build_offline.sh DIR
#   --prefix P     use a kit already unpacked and built (sources P/env.sh)
#   --cpu          CPU mode (also chosen when no GPU is usable): each point
#                  that has a CPU form runs it at a small size; the report
#                  says "CPU mode -- not a GPU proof" and lists what needs one
#   --cpu-build    (a) in CPU mode: the CPU build's memtrain (default build/memtrain)
#   --points LIST  the acceptance points to run (default a,b,c,d,e,f,g)
#   --no-ctest     leave the test suite out (a machine that limits a command's time)
#   MEMTRAIN_GPU_CTEST_ARGS  extra ctest arguments (e.g. "-LE e2e" to leave
#                  the end-to-end scripts out; the report says so)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/launch/gpu/lib.sh"
usage="usage: $0 [--kit DIR | --prefix P] [--cpu] [--out DIR] [--build-dir B] [--cpu-build BIN] [--python PY] [--points a,b,..] [--no-ctest] [--hide-system]"
kit= prefix= cpu=0 out= build= cpubin=$src/build/memtrain python=python3 hide=() points=a,b,c,d,e,f,g ctest=1
while [ $# -gt 0 ]; do
  case "$1" in
    --kit | --prefix | --out | --build-dir | --cpu-build | --python | --points)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      case "$1" in
        --kit) kit=$2 ;; --prefix) prefix=$2 ;; --out) out=$2 ;;
        --build-dir) build=$2 ;; --cpu-build) cpubin=$2 ;; --python) python=$2 ;;
        --points) points=$2 ;;
      esac
      shift 2 ;;
    --cpu) cpu=1; shift ;;
    --no-ctest) ctest=0; shift ;;
    --hide-system) hide=(--hide-system); shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
out=${out:-$src/runs/gpu-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS

# --- the build -----------------------------------------------------------
if [ -n "$kit" ]; then
  t0=$SECONDS
  bash "$src/launch/gpu/build_offline.sh" "$kit" ${build:+--build-dir "$build"} \
    --python "$python" "${hide[@]}" 2>&1 | tee "$out/build.log"
  build_s=$((SECONDS - t0))
  prefix=$(cd "$kit" && pwd)/prefix
fi
if [ -n "$prefix" ]; then
  [ -f "$prefix/env.sh" ] || die "$prefix/env.sh missing: run launch/gpu/build_offline.sh first"
  source "$prefix/env.sh"
fi
B=${build:-${MEMTRAIN_BUILD_DIR:-build-gpu}}
case "$B" in /*) ;; *) B=$src/$B ;; esac
M=$B/memtrain
[ -x "$M" ] || die "$M not built (bash launch/gpu/build_offline.sh KIT, or --kit KIT)"
grep -q '^MEMTRAIN_CUDA:BOOL=ON' "$B/CMakeCache.txt" || die "$B is not a -DMEMTRAIN_CUDA=ON build"
source "$src/launch/env.sh"
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
MPIEXEC=${MEMTRAIN_MPIEXEC:-$(command -v mpiexec || command -v mpirun)}
PYX=$(command -v python3)
ACC="$PYX $src/tests/gpu/acceptance.py"

# --- GPU or CPU mode, versions ---------------------------------------------
gpu=0
if [ "$cpu" = 0 ] && nvidia-smi -L >/dev/null 2>&1 &&
   "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  gpu=1
fi
dev=cpu
[ "$gpu" = 0 ] || dev=cuda
R=$out/gpu-report.md
row() {  # POINT STATUS FIGURES; in CPU mode a PASS or FAIL is of the CPU form
  local st=$2
  [ "$gpu" = 1 ] || case "$st" in PASS | FAIL) st="$st (CPU form)" ;; esac
  echo "| $1 | $st | $3 |" >>"$out/points.md"
  echo "point $1: $st -- $3"
}
: >"$out/points.md"
: >"$out/details.md"
detail() { { echo; echo "### $1"; echo '```'; cat; echo '```'; } >>"$out/details.md"; }
gpu_name=none driver=none gpu_mem=0
if [ "$gpu" = 1 ]; then
  IFS=, read -r gpu_name driver gpu_mem < <(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits | head -1)
fi
torch_v=$("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "no torch in $python")
nccl_v=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$B/CMakeCache.txt" | xargs -I{} sh -c \
  "grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' {}/nccl.h | awk '{print \$3}' | paste -sd." 2>/dev/null || echo unknown)
nvcc_v=$( (find_nvcc >/dev/null && "$(find_nvcc)" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') || echo none)
W=$out/work
rm -rf "$W" && mkdir -p "$W" && cd "$W"

# --- every test ------------------------------------------------------------
t0=$SECONDS
ctest_rc=0
# Two end-to-end scripts read Debian's mricron-data, which the kit does not carry.
MEMTRAIN_GPU_CTEST_ARGS=${MEMTRAIN_GPU_CTEST_ARGS:-}
if [ ! -f /usr/share/mricron/templates/ch2.nii.gz ]; then
  MEMTRAIN_GPU_CTEST_ARGS="$MEMTRAIN_GPU_CTEST_ARGS -E e2e_(brain_mask|convert_nifti) (no mricron-data here)"
fi
if [ "$ctest" = 1 ]; then
  (cd "$B" && ctest --output-on-failure ${MEMTRAIN_GPU_CTEST_ARGS%% (*}) >"$out/ctest.log" 2>&1 || ctest_rc=$?
else
  echo "not run (--no-ctest)" >"$out/ctest.log"
fi
ctest_s=$((SECONDS - t0))
ctest_sum=$(grep -E 'tests passed|tests failed|No tests were found|not run' "$out/ctest.log" | tail -1 || true)
{ grep -ho 'Skipping [0-9]* GPU-only tests* (\*_CUDA): [^"]*' "$B/Testing/Temporary/LastTest.log" 2>/dev/null |
    sort | uniq -c || true; } | detail "ctest: the mains' lines about skipped *_CUDA tests (count of test runs)"
{ grep -E '^ *[0-9]+/[0-9]+ Test' "$out/ctest.log" || true; } | detail "ctest ($ctest_sum, ${ctest_s} s, args: ${MEMTRAIN_GPU_CTEST_ARGS:-none})"

# --- acceptance --------------------------------------------------------------
run() {  # NP NAME BINARY ARGS...: train, log in NAME.log; returns the exit status
  local np=$1 name=$2 bin=$3
  shift 3
  timeout "${MEMTRAIN_GPU_RUN_TIMEOUT:-1200}" "$MPIEXEC" --oversubscribe -np "$np" "$bin" train \
    --output.dir="$name" --data.val= "$@" >"$name.log" 2>&1
}
mkvol() { "$M" make-data --kind volumes --channels 1 --classes 3 --noise 0.7 "$@" >/dev/null; }
if [ "$gpu" = 1 ]; then FS=16 PS=32 EDGE=64; else FS=8 PS=16 EDGE=32; fi
UNET=(--data.train=vol.h5 --model.name=unet3d --model.feature_size=$FS --model.depth=3
      --model.norm=instance --data.patch_size=$PS --training.optimizer=adamw --training.lr=0.003)
# Equivalence runs use plain SGD: Adam's first steps divide by |g| and turn
# rounding noise in small gradients into differences of the order of lr.
EQ=(--training.optimizer=sgd --training.lr=0.1 --training.momentum=0)
mkvol --out vol.h5 --samples 4 --depth $EDGE --height $EDGE --width $EDGE --chunk 16

point_a() {
  local ref=$M refdev=cpu what
  if [ "$gpu" = 0 ]; then
    [ -x "$cpubin" ] || { row a "NOT RUN" "no CPU build at $cpubin (bash launch/build.sh --target memtrain)"; return 0; }
    ref=$cpubin
    what="CPU build ($cpubin, Debian LibTorch) vs CUDA build with dist.device=cpu"
  else
    what="CUDA build dist.device=cpu vs dist.device=cuda, fp32"
  fi
  # Deterministic kernels, no TF32 (training.deterministic): fp32 on both.
  local A=(--data.batch_size=2 --training.gradient_accumulation_steps=2 --training.max_windows=5 --dist.backend=mpi --training.deterministic=true "${EQ[@]}")
  run 1 a_ref "$ref" "${UNET[@]}" "${A[@]}" --dist.device=$refdev || { row a FAIL "reference run failed (a_ref.log)"; return 0; }
  run 1 a_dev "$M" "${UNET[@]}" "${A[@]}" --dist.device=$dev || { row a FAIL "run failed (a_dev.log)"; return 0; }
  local d rc=0
  d=$($ACC reldiff a_dev/model.safetensors a_ref/model.safetensors 1e-4) || rc=$?
  local line="$what, 5 windows: $d"
  if [ "$gpu" = 1 ]; then
    local n rc2=0
    run 1 a_nccl "$M" "${UNET[@]}" "${A[@]}" --dist.device=cuda --dist.backend=nccl || rc2=$?
    if [ $rc2 = 0 ]; then
      n=$($ACC absdiff a_nccl/model.safetensors a_dev/model.safetensors 0) || rc=1
    else
      n="NCCL run failed, exit $rc2: $(tail -1 a_nccl.log)" rc=1
    fi
    line="$line; world-1 NCCL vs MPI (equal bits wanted): $n"
  else
    line="$line; world-1 NCCL vs MPI needs a GPU"
  fi
  row a "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$line"
}

point_b() {
  local amp=bf16 ok=1 p budget
  if [ "$gpu" = 1 ]; then
    amp=fp16 budget=v100-16gb
    mkvol --out seed.h5 --samples 4 --depth 128 --height 128 --width 128 --chunk 32
    B_ARGS=(--data.train=seed.h5 --model.name=unet3d --model.feature_size=48 --data.patch_size=96
            --training.optimizer=adamw --training.effective_batch_size=8 --training.max_windows=3)
  else
    mkvol --out seed.h5 --samples 4 --depth 48 --height 48 --width 48 --chunk 16
    B_ARGS=(--data.train=seed.h5 --model.name=unet3d --model.feature_size=8 --data.patch_size=32
            --training.optimizer=adamw --training.effective_batch_size=8 --training.max_windows=1)
    # The budget: between the allocated peaks measured at micro-batch 2 and 8
    # (mem_peak: without a budget the reserved peak includes cache).
    run 1 b_m2 "$M" "${B_ARGS[@]}" --training.amp=$amp --data.batch_size=2 || { row b FAIL "b_m2 failed"; return 0; }
    run 1 b_m8 "$M" "${B_ARGS[@]}" --training.amp=$amp --data.batch_size=8 || { row b FAIL "b_m8 failed"; return 0; }
    budget=$(( ($($ACC peak b_m2 mem_peak) + $($ACC peak b_m8 mem_peak)) / 2 ))
  fi
  run 1 b_auto "$M" "${B_ARGS[@]}" --training.amp=$amp --data.batch_size=auto \
    --training.gradient_checkpointing=auto --memory.budget=$budget --dist.device=$dev || ok=0
  local plan=$($ACC plan b_auto 2>/dev/null || echo "no memory_plan.json")
  local win=$($ACC windows b_auto 2>/dev/null || echo "no windows")
  p=$(sed -n 's/.*mem_peak_reserved=\([0-9]*\).*/\1/p' <<<"$win")
  local bb=$(sed -n 's/.*budget_bytes=\([0-9]*\).*/\1/p' <<<"$plan")
  [ -n "$p" ] && [ -n "$bb" ] && [ "$p" -lt "$bb" ] || ok=0
  local rc=0
  run 1 b_m8_fixed "$M" "${B_ARGS[@]}" --training.amp=$amp --data.batch_size=8 \
    --training.gradient_accumulation_steps=1 --training.gradient_checkpointing=off \
    --memory.budget=$budget --memory.max_oom_retries=0 --dist.device=$dev || rc=$?
  local said=$(grep -m1 -o 'out of device memory: .*' b_m8_fixed.log | cut -c1-200 || true)
  [ "$rc" != 0 ] && [ -n "$said" ] || ok=0
  row b "$([ $ok = 1 ] && echo PASS || echo FAIL)" "amp $amp, budget $budget: auto: $plan; $win; micro 8 without accumulation or checkpointing: exit $rc, \"$said\""
}

point_c() {
  local C=(--training.effective_batch_size=8 --training.max_windows=3 --dist.device=$dev "${EQ[@]}")
  run 1 c_m4 "$M" "${UNET[@]}" "${C[@]}" --data.batch_size=4 || { row c FAIL "c_m4 failed"; return 0; }
  run 1 c_m2 "$M" "${UNET[@]}" "${C[@]}" --data.batch_size=2 || { row c FAIL "c_m2 failed"; return 0; }
  local p4=$($ACC peak c_m4 mem_peak) p2=$($ACC peak c_m2 mem_peak)
  local budget=$(( (p2 + p4) / 2 )) rc=0
  run 1 c_oom "$M" "${UNET[@]}" "${C[@]}" --data.batch_size=4 --memory.budget=$budget ||
    { row c FAIL "c_oom failed: $(tail -1 c_oom.log)"; return 0; }
  local w=$($ACC windows c_oom) d
  d=$($ACC absdiff c_oom/model.safetensors c_m2/model.safetensors 1e-5) || rc=1
  grep -q 'oom_retries=[1-9]' <<<"$w" || rc=1
  row c "$([ $rc = 0 ] && echo PASS || echo FAIL)" "allocated peaks micro 4 $p4 B, micro 2 $p2 B, budget $budget B: $w; vs micro 2 from the start: $d"
}

point_d() {
  local D=(--data.batch_size=2 --training.gradient_accumulation_steps=2 --training.max_windows=30 --training.epochs=100 --dist.device=$dev)
  local rc=0 amp=fp16
  run 1 d_fp16 "$M" "${UNET[@]}" "${D[@]}" --training.amp=fp16 || rc=$?
  if [ "$gpu" = 0 ]; then
    local why=$(grep -m1 -iE 'fp16|error' d_fp16.log | cut -c1-160)
    amp=bf16
    run 1 d_bf16 "$M" "${UNET[@]}" "${D[@]}" --training.amp=bf16 || { row d FAIL "bf16 form failed"; return 0; }
    row d "CPU form" "fp16 on the CPU: exit $rc, \"$why\"; bf16 instead: $($ACC windows d_bf16); the loss scaler needs a GPU"
    return 0
  fi
  [ $rc = 0 ] || { row d FAIL "exit $rc: $(tail -1 d_fp16.log)"; return 0; }
  local w=$($ACC windows d_fp16) ok=1
  grep -q 'loss_scale_last=' <<<"$w" && grep -q 'finite=True' <<<"$w" || ok=0
  row d "$([ $ok = 1 ] && echo PASS || echo FAIL)" "fp16, 30 windows: $w"
}

point_e() {
  local E=(--training.effective_batch_size=8 --training.max_windows=3 --dist.device=$dev --dist.backend=mpi "${EQ[@]}")
  local budget=()
  [ "$gpu" = 0 ] || budget=(--memory.budget=$(( gpu_mem * 1024 * 1024 / 2 - 1024 * 1024 * 1024 )))
  run 1 e_np1 "$M" "${UNET[@]}" "${E[@]}" --data.batch_size=2 "${budget[@]}" || { row e FAIL "e_np1 failed"; return 0; }
  run 2 e_np2 "$M" "${UNET[@]}" "${E[@]}" --data.batch_size=2 "${budget[@]}" || { row e FAIL "e_np2 failed: $(tail -1 e_np2.log)"; return 0; }
  local rc=0 d
  d=$($ACC absdiff e_np2/model.safetensors e_np1/model.safetensors 1e-5) || rc=1
  local line="2 ranks over MPI on $dev ${budget[*]} vs 1 rank, effective batch 8: $d"
  if [ "$gpu" = 1 ]; then
    local nrc=0
    run 2 e_nccl "$M" "${UNET[@]}" "${E[@]}" --dist.backend=nccl --data.batch_size=2 || nrc=$?
    local said=$(grep -m1 -o 'NCCL refuses two ranks on one GPU[^)]*)' e_nccl.log || true)
    [ "$nrc" != 0 ] && [ -n "$said" ] || rc=1
    line="$line; NCCL 2 ranks: exit $nrc, \"$said\""
  else
    line="$line; NCCL's refusal needs a GPU"
  fi
  row e "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$line"
}

point_f() {
  local h=$src/benchmarks/vs_pytorch/run.sh
  [ -f "$h" ] || { row f "NOT RUN" "harness not present ($h)"; return 0; }
  local rc=0
  # On the GPU: one rank (NCCL, and PyTorch DDP's NCCL, refuse two ranks on
  # one GPU) and the GPU-sized U-Net; on the CPU: two ranks, the full size.
  local fa=(--np 2 --size full)
  [ "$gpu" = 0 ] || fa=(--np 1 --size gpu)
  bash "$h" --memtrain "$M" --device $dev --models unet3d "${fa[@]}" --out "$W/f" >f.log 2>&1 || rc=$?
  tail -20 f.log | detail "(f) vs_pytorch ($dev)"
  [ -f f/vs_pytorch.csv ] && detail "(f) vs_pytorch.csv" <f/vs_pytorch.csv
  row f "$([ $rc = 0 ] && [ -f f/vs_pytorch.csv ] && echo "$([ "$gpu" = 1 ] && echo MEASURED || echo 'CPU form')" || echo FAIL)" \
    "$(tail -3 f.log | tr '\n' ' ' | cut -c1-300)"
}

point_g() {
  local ov=(-w 1 -n 2 --hidden 256 --depth 2) me=(-b 32 -e 32 -w 1 -n 1 --models mlp,cnn) rc=0 rc2=0
  # On the GPU: both ranks of bench_overlap share the one GPU, so over MPI
  # (NCCL refuses two ranks on one GPU); bench_memory on one rank.
  [ "$gpu" = 0 ] || { ov=(--device cuda --backend mpi); me=(--device cuda); }
  timeout 900 "$MPIEXEC" --oversubscribe -np 2 "$B/benchmarks/bench_overlap" "${ov[@]}" >g_overlap.log 2>&1 || rc=$?
  timeout 900 "$MPIEXEC" --oversubscribe -np 1 "$B/benchmarks/bench_memory" "${me[@]}" >g_memory.log 2>&1 || rc2=$?
  detail "(g) bench_overlap -np 2 ${ov[*]} (exit $rc)" <g_overlap.log
  detail "(g) bench_memory ${me[*]} (exit $rc2)" <g_memory.log
  row g "$([ $rc = 0 ] && [ $rc2 = 0 ] && echo "$([ "$gpu" = 1 ] && echo MEASURED || echo 'CPU form')" || echo FAIL)" \
    "bench_overlap exit $rc, bench_memory exit $rc2 (tables below; their banners name the device)"
}

for p in ${points//,/ }; do
  [[ "$p" =~ ^[a-g]$ ]] || die "--points: $p is not one of a-g"
  t0=$SECONDS
  "point_$p" || row $p FAIL "the script's check itself failed (see $W)"
  echo "point $p: $((SECONDS - t0)) s"
done
env_line=$($ACC env a_dev 2>/dev/null || echo "")

# --- the report --------------------------------------------------------------
{
  echo "# memtrain GPU report"
  echo
  if [ "$gpu" = 0 ]; then
    echo "**CPU mode — not a GPU proof.** No GPU was used$([ "$cpu" = 1 ] && echo ' (--cpu)' || echo ' (none usable: nvidia-smi or torch.cuda)'). Points that need a GPU: (a) CUDA vs CPU weights and world-1 NCCL vs MPI, (b) the seed-001 scenario at 96³/feature 48 under v100-16gb, (c) the OOM replay on the GPU, (d) fp16 with the dynamic loss scaler, (e) 2 ranks sharing one GPU and NCCL's refusal, (f) memtrain vs PyTorch on the GPU, (g) the benchmarks on the GPU."
    echo
  fi
  echo "| what | value |"
  echo "| --- | --- |"
  echo "| date (UTC) | $(date -u +%Y-%m-%dT%H:%M:%SZ) |"
  echo "| host | $(hostname), $(nproc --all) cores |"
  echo "| mode | $([ "$gpu" = 1 ] && echo GPU || echo 'CPU mode — not a GPU proof') |"
  echo "| GPU | $gpu_name, ${gpu_mem} MiB |"
  echo "| driver | $driver |"
  echo "| CUDA (nvcc; torch) | $nvcc_v; $torch_v |"
  echo "| LibTorch / NCCL built against | $torch_v / NCCL $nccl_v |"
  echo "| build | $B $([ -n "${build_s:-}" ] && echo "(build_offline.sh took ${build_s} s in this call)") |"
  echo "| launcher | $MPIEXEC |"
  echo "| environment.json (a) | $env_line |"
  echo "| ctest | $ctest_sum (exit $ctest_rc, ${ctest_s} s, extra args: ${MEMTRAIN_GPU_CTEST_ARGS:-none}) |"
  echo
  echo "| point | result | figures |"
  echo "| --- | --- | --- |"
  cat "$out/points.md"
  echo
  echo "## Details"
  cat "$out/details.md"
  echo
  echo "Runs and logs: $W. Whole script: $((SECONDS - start)) s."
} >"$R"
echo "run.sh: wrote $R"
if grep -q '| FAIL' "$out/points.md" || [ "$ctest_rc" != 0 ]; then exit 1; fi
