#!/usr/bin/env bash
# The GPU proof (issue 10): the CUDA configuration's unit and MPI tests (the
# *_CUDA ones included where a GPU is usable), then the acceptance runs
# (a)-(h); writes OUT/gpu-report.md with the versions, the date, the time of
# each part and every figure, each point PASS, FAIL or NOT RUN.
# usage: tests/gpu/run.sh [--bundle DIR | --kit DIR | --prefix P] [--cpu]
#          [--out DIR] [--build-dir B] [--cpu-build BIN] [--python PY]
#          [--points LIST] [--no-ctest] [--hide-system]
#   --bundle DIR   executables built elsewhere (launch/gpu/bundle.sh): no
#                  build, no network, no root. Unpacks DIR/kit (Open MPI,
#                  HDF5, ... with dpkg-deb -x) into DIR/prefix
#                  ($MEMTRAIN_BUNDLE_PREFIX), checks that --python's torch is
#                  the one the executables were built against (version,
#                  CUDA, C++ ABI; else it says so and builds here with
#                  launch/gpu/build_offline.sh), and loads LibTorch and the
#                  NVIDIA libraries from that torch's folders
#   --kit DIR      build first with launch/gpu/build_offline.sh DIR
#   --prefix P     use a kit already unpacked and built (sources P/env.sh)
#   --cpu          CPU mode (also chosen when no GPU is usable): each point
#                  that has a CPU form runs it at a small size; the report
#                  says "CPU mode -- not a GPU proof" and lists what needs one
#   --cpu-build    (a) in CPU mode: the CPU build's memtrain (default build/memtrain)
#   --python       the Python whose torch the executables load (bundle) or
#                  that the build uses (default python3)
#   --points LIST  the acceptance points to run (default a,b,c,d,e,f,g,h)
#   --no-ctest     leave the unit and MPI tests out
#   MEMTRAIN_GPU_CTEST_ARGS  extra ctest arguments (a build folder, not a
#                  bundle; the report says so)
#   MEMTRAIN_GPU_TEST_TIMEOUT  seconds for each test binary of a bundle
#                  (default 300 unit, 600 each MPI run, as in ctest)
#   MEMTRAIN_GPU_RUN_TIMEOUT   seconds for each training run (default 1200)
# Which GPU: nvidia-smi lists one and `memtrain probe` (the executable's own
# view through LibTorch) counts at least one device; an executable without
# the probe subcommand: nvidia-smi alone.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/launch/gpu/lib.sh"
usage="usage: $0 [--bundle DIR | --kit DIR | --prefix P] [--cpu] [--out DIR] [--build-dir B] [--cpu-build BIN] [--python PY] [--points a,b,..,h] [--no-ctest] [--hide-system]"
bundle= kit= prefix= cpu=0 out= build= cpubin=$src/build/memtrain python=python3 hide=() points=a,b,c,d,e,f,g,h ctest=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle | --kit | --prefix | --out | --build-dir | --cpu-build | --python | --points)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      case "$1" in
        --bundle) bundle=$2 ;; --kit) kit=$2 ;; --prefix) prefix=$2 ;; --out) out=$2 ;;
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
n=0
for v in "$bundle" "$kit" "$prefix"; do [ -z "$v" ] || n=$((n + 1)); done
[ $n -le 1 ] || die "give one of --bundle, --kit and --prefix, not several"
for p in ${points//,/ }; do
  [[ "$p" =~ ^[a-h]$ ]] || die "--points: $p is not one of a-h"
done
out=${out:-$src/runs/gpu-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS
: >"$out/times.md"
took() {  # WHAT SECONDS: one row of the report's time table, and a line now
  echo "| $1 | $2 s |" >>"$out/times.md"
  say "$1: $2 s"
}

# --- a bundle: unpack and check, or build here ----------------------------------
build_note=
if [ -n "$bundle" ]; then
  t0=$SECONDS
  bundle=$(cd "$bundle" 2>/dev/null && pwd) || die "no bundle folder $bundle (make it with launch/gpu/bundle.sh)"
  [ -f "$bundle/BUNDLE.info" ] || die "$bundle has no BUNDLE.info: not a bundle from launch/gpu/bundle.sh"
  (cd "$bundle" && sha256sum --quiet -c SHA256SUMS) ||
    die "a file of $bundle does not match its SHA256SUMS: copy the bundle again"
  py=$(command -v "$python" || true)
  [ -n "$py" ] || die "no $python: give the Python that holds the node's PyTorch with --python"
  probe=$(torch_probe "$py" 2>"$out/torch-probe.err") ||
    die "$py: $(tail -1 "$out/torch-probe.err") (the executables load LibTorch from the node's torch: pass --python)"
  IFS=';' read -r tv tcmake tcuda tabi site tgit tnccl <<<"$probe"
  wv=$(bundle_get "$bundle" torch_version) wc=$(bundle_get "$bundle" torch_cuda)
  wa=$(bundle_get "$bundle" torch_cxx11_abi) wg=$(bundle_get "$bundle" torch_git)
  if [ "$tv" != "$wv" ] || [ "$tcuda" != "$wc" ] || [ "$tabi" != "$wa" ]; then
    say "the bundle's executables were built against torch $wv (CUDA $wc, C++11 ABI $wa); $py has torch $tv (CUDA $tcuda, ABI $tabi): they cannot load it, so building here from the sources and the bundle's kit with launch/gpu/build_offline.sh (needs nvcc, cmake and g++; 16 cores: about 4 minutes)"
    [ -f "$src/CMakeLists.txt" ] ||
      die "no sources at $src to build from: run tests/gpu/run.sh of a memtrain checkout, or use a Python with torch $wv (CUDA $wc) (--python)"
    kit=$bundle/kit
    build=${build:-build-gpu}
    MEMTRAIN_GPU_TARGETS=${MEMTRAIN_GPU_TARGETS:-memtrain,memtrain_unit_tests,memtrain_mpi_tests,bench_memory,bench_overlap}
    build_note="the bundle's torch $wv (CUDA $wc) is not $py's $tv (CUDA $tcuda): built here"
    bundle=
  else
    [ "$tgit" = "$wg" ] ||
      say "note: $py's torch $tv is another build (git $tgit) than the bundle's (git $wg); same version, CUDA and ABI: using the bundle"
    prefix=${MEMTRAIN_BUNDLE_PREFIX:-$bundle/prefix}
    if [ ! -f "$prefix/env.sh" ] || [ "$(cat "$prefix/.bundle-id" 2>/dev/null)" != "$(bundle_get "$bundle" id)" ]; then
      rm -rf "$prefix"
      bash "$src/launch/gpu/build_offline.sh" "$bundle/kit" "$prefix" --no-build --python "$py" \
        >"$out/unpack.log" 2>&1 || { cat "$out/unpack.log" >&2; die "unpacking $bundle/kit failed (log: $out/unpack.log)"; }
      sed -n 's/^build_offline.sh: //p' "$out/unpack.log"
      bundle_get "$bundle" id >"$prefix/.bundle-id"
    fi
    B=$prefix/bin
    if [ ! -x "$B/memtrain" ] || [ "$(cat "$B/.bundle-id" 2>/dev/null)" != "$(bundle_get "$bundle" id)" ]; then
      rm -rf "$B" && mkdir -p "$B"
      tar -xJf "$bundle/bin.tar.xz" -C "$B" || die "cannot unpack $bundle/bin.tar.xz (xz missing? tar -xJf needs xz-utils)"
      bundle_get "$bundle" id >"$B/.bundle-id"
    fi
    build_note="bundle $bundle: $(bundle_get "$bundle" built)"
  fi
fi

# --- the build -----------------------------------------------------------
if [ -n "$kit" ]; then
  t0=$SECONDS
  bash "$src/launch/gpu/build_offline.sh" "$kit" ${build:+--build-dir "$build"} \
    ${MEMTRAIN_GPU_TARGETS:+--targets "$MEMTRAIN_GPU_TARGETS"} \
    --python "$python" "${hide[@]}" 2>&1 | tee "$out/build.log"
  build_s=$((SECONDS - t0))
  took "build_offline.sh (unpack, MPI check, configure, build)" "$build_s"
  prefix=$(cd "$kit" && pwd)/prefix
fi
if [ -n "$prefix" ]; then
  [ -f "$prefix/env.sh" ] || die "$prefix/env.sh missing: run launch/gpu/build_offline.sh first"
  source "$prefix/env.sh"
fi
source "$src/launch/env.sh"
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
MPIEXEC=${MEMTRAIN_MPIEXEC:-$(command -v mpiexec || command -v mpirun || true)}
[ -n "$MPIEXEC" ] || die "no mpiexec: give a kit (--bundle, --kit or --prefix) or put Open MPI on PATH"
if [ -n "$bundle" ]; then
  # LibTorch and the NVIDIA libraries (cudart, NCCL, cuBLAS, cuDNN, ...) of
  # the node's torch before the executables' build-time run paths.
  export LD_LIBRARY_PATH="$(torch_lib_path "$site"):$LD_LIBRARY_PATH"
  M=$B/memtrain
  missing=$(for f in "$B"/*; do ldd "$f" 2>&1 | awk -v f="$(basename "$f")" '/not found/ {print f ": " $1}'; done | sort -u)
  [ -z "$missing" ] || die "libraries not found (LD_LIBRARY_PATH: the kit and $site/torch/lib, $site/nvidia/*/lib): $(echo $missing)"
  at=$(ldd "$M" | awk '$1 == "libtorch_cpu.so" {print $3}')
  case "$at" in "$site"/torch/lib/*) ;; *) die "memtrain loads libtorch_cpu.so from ${at:-nowhere}, not from $site/torch/lib" ;; esac
  timeout 120 "$MEMTRAIN_MPIEXEC" --oversubscribe -np 2 "$M" --version >"$out/mpi-check.log" 2>&1 ||
    { cat "$out/mpi-check.log" >&2; die "mpiexec -np 2 memtrain --version failed with the kit's Open MPI"; }
  took "bundle: verify, unpack the kit and the executables, check libraries and mpiexec" $((SECONDS - t0))
else
  B=${build:-${MEMTRAIN_BUILD_DIR:-build-gpu}}
  case "$B" in /*) ;; *) B=$src/$B ;; esac
  M=$B/memtrain
  [ -x "$M" ] || die "$M not built (bash launch/gpu/build_offline.sh KIT, --kit KIT, or --bundle DIR)"
  grep -q '^MEMTRAIN_CUDA:BOOL=ON' "$B/CMakeCache.txt" || die "$B is not a -DMEMTRAIN_CUDA=ON build"
  build_note=${build_note:-"$B"}
fi
PYX=$(command -v python3 || command -v "$python")
ACC="$PYX $src/tests/gpu/acceptance.py"

# --- GPU or CPU mode, versions ---------------------------------------------
gpu=0 why=
probe_out=
if "$M" --help 2>/dev/null | grep -qE '^ +probe( |$)'; then
  probe_out=$(timeout 120 "$M" probe 2>&1) || probe_out="memtrain probe failed: $probe_out"
fi
pval() { sed -n "s/^$1 //p" <<<"$probe_out" | head -1; }
if [ "$cpu" = 1 ]; then
  why="--cpu"
elif ! nvidia-smi -L >/dev/null 2>&1; then
  why="nvidia-smi lists no GPU (or is missing)"
elif [ -n "$probe_out" ] && ! [ "$(pval devices | awk '{print $1}')" -ge 1 ] 2>/dev/null; then
  why="nvidia-smi lists a GPU but memtrain probe counts none: $(echo $probe_out | cut -c1-200)"
else
  gpu=1
fi
[ -n "$probe_out" ] || probe_out="(this memtrain has no probe subcommand: GPU from nvidia-smi alone)"
dev=cpu
[ "$gpu" = 0 ] || dev=cuda
say "$([ "$gpu" = 1 ] && echo "GPU mode" || echo "CPU mode ($why)")"
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
echo "$probe_out" | detail "memtrain probe"
gpu_name=none driver=none gpu_mem=0
if nvidia-smi -L >/dev/null 2>&1; then
  IFS=, read -r gpu_name driver gpu_mem < <(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits | head -1)
fi
if [ -n "$(pval torch)" ]; then
  torch_v="$(pval torch) CUDA $(pval cuda_build) (memtrain probe)"
else
  torch_v=$("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "no torch in $python")
fi
if [ -n "$(pval nccl)" ]; then
  nccl_v=$(pval nccl)
elif [ -z "$bundle" ]; then
  nccl_v=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$B/CMakeCache.txt" | xargs -I{} sh -c \
    "grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' {}/nccl.h | awk '{print \$3}' | paste -sd." 2>/dev/null || echo unknown)
else
  nccl_v="$(bundle_get "$bundle" nccl) (nccl.h at the bundle's build)"
fi
nvcc_v=$( (find_nvcc >/dev/null && "$(find_nvcc)" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') || echo none)
W=$out/work
rm -rf "$W" && mkdir -p "$W" && cd "$W"

# --- the unit and MPI tests ------------------------------------------------------
# The end-to-end scripts are left out: they assume the CPU device and the
# CPU build's Python peers. The *_CUDA tests run where a GPU is usable.
t0=$SECONDS
ctest_rc=0 ctest_args=
if [ "$ctest" = 0 ]; then
  echo "not run (--no-ctest)" >"$out/ctest.log"
elif [ -n "$bundle" ]; then
  # No build folder: the ctest entries' commands, as tests/CMakeLists.txt has them.
  filter=
  data=$(bundle_get "$bundle" test_data)
  if [ ! -d "$data" ]; then
    if grep -qa MEMTRAIN_TEST_DATA "$B/memtrain_unit_tests"; then
      export MEMTRAIN_TEST_DATA=$src/tests/data
    else
      filter=--gtest_filter=-ResNet.*KeysShapesAndCountAreTimms
      ctest_args="$filter ($data, the test data the unit tests were built to read, is not on this machine)"
    fi
  fi
  tenv=(env OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1)
  n=0 failed=()
  {
    for t in unit mpi_np1 mpi_np2 mpi_np4; do
      n=$((n + 1)) t1=$SECONDS rc=0
      case "$t" in
        unit) timeout "${MEMTRAIN_GPU_TEST_TIMEOUT:-300}" "${tenv[@]}" "$B/memtrain_unit_tests" $filter >"$out/test-$t.log" 2>&1 || rc=$? ;;
        *) memtrain_binding "${t#mpi_np}"  # each rank its share of the cores (env.sh)
           timeout "${MEMTRAIN_GPU_TEST_TIMEOUT:-600}" "${tenv[@]}" "$MPIEXEC" -np "${t#mpi_np}" --oversubscribe \
             "${MEMTRAIN_BINDING[@]}" "$B/memtrain_mpi_tests" \
             >"$out/test-$t.log" 2>&1 || rc=$? ;;
      esac
      [ $rc = 0 ] || failed+=("cuda_$t")
      printf '%3d/4 Test #%d: cuda_%s ... %s %d sec\n' $n $n "$t" "$([ $rc = 0 ] && echo Passed || echo "***Failed (exit $rc)")" $((SECONDS - t1))
    done
    echo
    echo "$(( (4 - ${#failed[@]}) * 100 / 4 ))% tests passed, ${#failed[@]} tests failed out of 4"
    [ ${#failed[@]} = 0 ] || echo "The following tests FAILED: ${failed[*]} (logs: $out/test-*.log)"
  } >"$out/ctest.log"
  [ ${#failed[@]} = 0 ] || ctest_rc=8
  cat "$out"/test-*.log >"$out/tests-output.log"
else
  ctest_args="-L ^(unit|mpi)$ ${MEMTRAIN_GPU_CTEST_ARGS:-}"
  (cd "$B" && ctest --output-on-failure -L '^(unit|mpi)$' ${MEMTRAIN_GPU_CTEST_ARGS:-}) >"$out/ctest.log" 2>&1 || ctest_rc=$?
  cp "$B/Testing/Temporary/LastTest.log" "$out/tests-output.log" 2>/dev/null || : >"$out/tests-output.log"
fi
ctest_s=$((SECONDS - t0))
took "unit and MPI tests" "$ctest_s"
ctest_sum=$(grep -E 'tests passed|tests failed|No tests were found|not run' "$out/ctest.log" | tail -1 || true)
{ grep -ho 'SKIP ([a-z]*): [0-9]* GPU-only tests* (\*_CUDA): [^"]*' "$out/tests-output.log" 2>/dev/null |
    sort | uniq -c || true; } | detail "tests: the mains' lines about skipped *_CUDA tests (count of test runs)"
{ grep -E '^ *[0-9]+/[0-9]+ Test|FAILED' "$out/ctest.log" || true; } | detail "tests ($ctest_sum, ${ctest_s} s, args: ${ctest_args:-none})"

# --- acceptance --------------------------------------------------------------
run() {  # NP NAME BINARY ARGS...: train, log in NAME.log; returns the exit status
  local np=$1 name=$2 bin=$3
  shift 3
  memtrain_binding "$np"  # each rank its share of the cores, not one (env.sh)
  timeout "${MEMTRAIN_GPU_RUN_TIMEOUT:-1200}" "$MPIEXEC" --oversubscribe -np "$np" "${MEMTRAIN_BINDING[@]}" "$bin" train \
    --output.dir="$name" --data.val= "$@" >"$name.log" 2>&1
}
mkvol() { "$M" make-data --kind volumes --channels 1 --classes 3 --noise 0.7 "$@" >/dev/null; }
if [ "$gpu" = 1 ]; then FS=16 PS=32 EDGE=64; else FS=8 PS=16 EDGE=32; fi
UNET_MODEL=(--model.name=unet3d --model.feature_size=$FS --model.depth=3
      --model.norm=instance --training.optimizer=adamw --training.lr=0.003)
UNET=(--data.train=vol.h5 --data.patch_size=$PS "${UNET_MODEL[@]}")
# Equivalence runs use plain SGD: Adam's first steps divide by |g| and turn
# rounding noise in small gradients into differences of the order of lr.
EQ=(--training.optimizer=sgd --training.lr=0.1 --training.momentum=0)
t0=$SECONDS
mkvol --out vol.h5 --samples 4 --depth $EDGE --height $EDGE --width $EDGE --chunk 16
took "make-data (${EDGE}^3 volumes)" $((SECONDS - t0))

point_a() {
  local ref=$M refdev=cpu what
  if [ "$gpu" = 0 ]; then
    if [ -x "$cpubin" ] && "$cpubin" --version >/dev/null 2>&1; then
      ref=$cpubin
      what="CPU build ($cpubin, Debian LibTorch) vs CUDA build with dist.device=cpu"
    else
      what="CUDA build with dist.device=cpu twice (the script's flow only: no CPU build runs here at $cpubin)"
    fi
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

# (b) the seed-001 scenario: launch/configs/unet3d-v100.yaml as shipped
# (U-Net depth 5, instance norm, feature size 48, 96^3 patches, AMP fp16,
# effective batch 8, batch size and checkpointing auto under v100-16gb),
# 3 windows on synthetic 128^3 volumes; then micro-batch 8 without
# accumulation or checkpointing under the same budget must be refused as
# out of device memory. CPU form: the same config at feature size 8, 32^3
# patches, bf16, and a budget between the peaks measured at micro 2 and 8.
point_b() {
  local amp ok=1 p budget cfg=$src/launch/configs/unet3d-v100.yaml
  [ -f "$cfg" ] || { row b "NOT RUN" "no $cfg"; return 0; }
  if [ "$gpu" = 1 ]; then
    amp=fp16 budget=v100-16gb
    mkvol --out seed.h5 --samples 4 --depth 128 --height 128 --width 128 --chunk 32
    B_ARGS=(--config "$cfg" --data.train=seed.h5 --training.max_windows=3)
  else
    # fp32: memtrain refuses bf16 on the CPU where a depth-5 U-Net's 32^3
    # patch halves to 2 voxels (oneDNN's bf16 3D convolution bug; a patch
    # of 48 would cost 3.4x the time); point (d) runs bf16 on the CPU.
    amp=off
    mkvol --out seed.h5 --samples 4 --depth 48 --height 48 --width 48 --chunk 16
    B_ARGS=(--config "$cfg" --data.train=seed.h5 --model.feature_size=8 --data.patch_size=32
            --validation.roi=32 --training.max_windows=1)
    # The budget: between the allocated peaks measured at micro-batch 2 and 8
    # (mem_peak: without a budget the reserved peak includes cache).
    run 1 b_m2 "$M" "${B_ARGS[@]}" --training.amp=$amp --data.batch_size=2 \
      --training.gradient_checkpointing=off --memory.budget=none || { row b FAIL "b_m2 failed: $(tail -1 b_m2.log)"; return 0; }
    run 1 b_m8 "$M" "${B_ARGS[@]}" --training.amp=$amp --data.batch_size=8 \
      --training.gradient_checkpointing=off --memory.budget=none || { row b FAIL "b_m8 failed: $(tail -1 b_m8.log)"; return 0; }
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
  if [ -s b_auto.log ]; then tail -5 b_auto.log | detail "(b) b_auto.log, last lines"; fi
  row b "$([ $ok = 1 ] && echo PASS || echo FAIL)" "$(basename "$cfg") (depth 5, instance norm), amp $amp, budget $budget: auto: $plan; $win; micro 8 without accumulation or checkpointing: exit $rc, \"$said\""
}

# (c) A real OOM, replayed: micro-batch 4 under a budget between the
# allocated peaks of micro-batches 4 and 2, plus what the process holds
# outside the caching allocator (a budget is the whole process's: the CUDA
# context, cuBLAS/cuDNN, NCCL), measured by the same runs under a budget of
# the whole card (memory_plan.json's outside_allocator_bytes; 0 on the
# CPU). On the GPU the patch is 96^3, so the peaks (GiBs) are far above
# that context. Deterministic (no TF32, no cuDNN benchmark, whose search
# would size workspaces from the free memory): the replay must end where
# micro-batch 2 from the start does, within 1e-5.
point_c() {
  local C=(--training.effective_batch_size=8 --training.max_windows=3 --dist.device=$dev
           --training.deterministic=true --training.gradient_checkpointing=off "${EQ[@]}")
  local data=("${UNET[@]}") card=()
  if [ "$gpu" = 1 ]; then
    mkvol --out cvol.h5 --samples 4 --depth 96 --height 96 --width 96 --chunk 32
    data=("${UNET_MODEL[@]}" --data.train=cvol.h5 --data.patch_size=96)
    card=(--memory.budget=$(( gpu_mem * 1024 * 1024 )))
  fi
  run 1 c_m4 "$M" "${data[@]}" "${C[@]}" --data.batch_size=4 "${card[@]}" || { row c FAIL "c_m4 failed: $(tail -1 c_m4.log)"; return 0; }
  run 1 c_m2 "$M" "${data[@]}" "${C[@]}" --data.batch_size=2 "${card[@]}" || { row c FAIL "c_m2 failed: $(tail -1 c_m2.log)"; return 0; }
  local p4=$($ACC peak c_m4 mem_peak) p2=$($ACC peak c_m2 mem_peak)
  local outside=$($ACC outside c_m4 2>/dev/null || echo 0)
  [ "$p2" -lt "$p4" ] || { row c FAIL "micro 2's allocated peak ($p2 B) is not below micro 4's ($p4 B)"; return 0; }
  local budget=$(( outside + (p2 + p4) / 2 )) rc=0
  run 1 c_oom "$M" "${data[@]}" "${C[@]}" --data.batch_size=4 --memory.budget=$budget ||
    { row c FAIL "c_oom failed: $(tail -1 c_oom.log)"; return 0; }
  local w=$($ACC windows c_oom) d
  d=$($ACC absdiff c_oom/model.safetensors c_m2/model.safetensors 1e-5) || rc=1
  grep -q 'oom_retries=[1-9]' <<<"$w" || rc=1
  grep -q 'micro_batch=2 ' <<<"$w" || rc=1
  grep -q 'replaying the window at micro-batch 2' c_oom.log || rc=1
  row c "$([ $rc = 0 ] && echo PASS || echo FAIL)" "allocated peaks micro 4 $p4 B, micro 2 $p2 B, outside the allocator $outside B, budget $budget B: $w; vs micro 2 from the start: $d"
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
  # Deterministic: 1e-5 between processes rules out TF32 and cuDNN's
  # benchmark (each process may pick other algorithms).
  local E=(--training.effective_batch_size=8 --training.max_windows=3 --dist.device=$dev --dist.backend=mpi
           --training.deterministic=true "${EQ[@]}")
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

# (h) Two nodes on the one GPU (issue 50, point 7): tests/multinode/cluster.sh
# makes 2 network/hostname namespaces on a bridge (root; the kit's ip where
# the node has none), mpirun starts 1 rank on each through its launcher
# agent, and the ranks sum their gradients across the "hosts" -- NCCL over
# its socket transport on the GPU (different hostnames: different NCCL
# host hashes, so no shared memory or P2P between them), MPI over TCP on
# the CPU -- against 1 node x 1 rank at the same effective batch.
point_h() {
  local C=$W/h_cluster rc=0 backend=mpi
  [ "$gpu" = 0 ] || backend=nccl
  bash "$src/tests/multinode/cluster.sh" up "$C" 2 >h_up.log 2>&1 || rc=$?
  if [ $rc = 77 ]; then
    row h "NOT RUN" "no namespaces here: $(sed -n 's/^SKIP[^:]*: //p' h_up.log)"
    return 0
  fi
  [ $rc = 0 ] || { bash "$src/tests/multinode/cluster.sh" down "$C"; row h FAIL "cluster.sh up: exit $rc: $(tail -1 h_up.log)"; return 0; }
  # shellcheck disable=SC1091
  source "$C/cluster.env"
  local H=(--training.effective_batch_size=8 --data.batch_size=2 --training.max_windows=3 --training.deterministic=true
           --dist.device=$dev --dist.backend=$backend "${EQ[@]}") budget=()
  [ "$gpu" = 0 ] || budget=(--memory.budget=$(( gpu_mem * 1024 * 1024 / 2 - 1024 * 1024 * 1024 )))
  h_across() {  # NODES NAME: train on NODES nodes x 1 rank, log in NAME.log
    head -n "$1" "$MT_HOSTFILE" >"h_hosts$1"
    timeout "${MEMTRAIN_GPU_RUN_TIMEOUT:-1200}" "$MPIEXEC" "${MT_MPI_ARGS[@]}" --hostfile "h_hosts$1" \
      --map-by ppr:1:node -np "$1" -x NCCL_SOCKET_IFNAME=eth0 -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET \
      "$M" train --output.dir="$W/$2" --data.val= "${UNET[@]}" --data.train="$W/vol.h5" "${H[@]}" "${budget[@]}" \
      >"$2.log" 2>&1
  }
  local r1=0 r2=0 line= ok=1 d hosts
  h_across 1 h_one || r1=$?
  h_across 2 h_two || r2=$?
  bash "$src/tests/multinode/cluster.sh" down "$C"
  local left
  left=$(bash "$src/tests/multinode/cluster.sh" check "$C" 2>&1) || { ok=0; line="left behind: $left; "; }
  [ $r1 = 0 ] || { row h FAIL "1 node x 1 rank: exit $r1: $(tail -1 h_one.log)"; return 0; }
  [ $r2 = 0 ] || { row h FAIL "2 nodes x 1 rank: exit $r2: $(grep -m1 'error' h_two.log || tail -1 h_two.log)"; return 0; }
  d=$($ACC absdiff h_two/model.safetensors h_one/model.safetensors 1e-5) || ok=0
  hosts=$($ACC hosts h_two) || ok=0
  grep -q "^nodes=2 ranks=node1:0:[^;]*;node2:1:" <<<"$hosts" || ok=0
  grep -q "on 2 nodes × 1 rank" h_two.log || ok=0
  line="$line$backend on $dev, 2 nodes x 1 rank vs 1 node x 1 rank, effective batch 8, 3 windows: $d; $hosts"
  if [ "$gpu" = 1 ]; then
    # NCCL between the two "hosts": its network transport over the sockets.
    local via
    via=$(grep -m1 -o 'via NET/Socket[^ ]*' h_two.log || true)
    [ -n "$via" ] || ok=0
    line="$line; NCCL: ${via:-no 'via NET/Socket' line (see h_two.log)}"
  fi
  row h "$([ $ok = 1 ] && echo PASS || echo FAIL)" "$line"
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
  [ -x "$B/bench_overlap" ] && [ -x "$B/bench_memory" ] ||
    { row g "NOT RUN" "bench_overlap or bench_memory not in $B"; return 0; }
  # On the GPU: both ranks of bench_overlap share the one GPU, so over MPI
  # (NCCL refuses two ranks on one GPU); bench_memory on one rank.
  # On the GPU bench_memory also measures the U-Net's tiers (none,
  # selective, all, offload: issue 30) at the seed size with the caching
  # allocator and the copy stream.
  [ "$gpu" = 0 ] || {
    ov=(--device cuda --backend mpi)
    me=(--device cuda --models mlp,cnn,unet3d --volume-size 96 --unet-feature 48
        --unet-depth 5 --unet-micro 1,2 --fits v100-16gb)
  }
  memtrain_binding 2
  timeout 900 "$MPIEXEC" --oversubscribe -np 2 "${MEMTRAIN_BINDING[@]}" "$B/bench_overlap" "${ov[@]}" >g_overlap.log 2>&1 || rc=$?
  memtrain_binding 1
  timeout 900 "$MPIEXEC" --oversubscribe -np 1 "${MEMTRAIN_BINDING[@]}" "$B/bench_memory" "${me[@]}" >g_memory.log 2>&1 || rc2=$?
  detail "(g) bench_overlap -np 2 ${ov[*]} (exit $rc)" <g_overlap.log
  detail "(g) bench_memory ${me[*]} (exit $rc2)" <g_memory.log
  row g "$([ $rc = 0 ] && [ $rc2 = 0 ] && echo "$([ "$gpu" = 1 ] && echo MEASURED || echo 'CPU form')" || echo FAIL)" \
    "bench_overlap exit $rc, bench_memory exit $rc2 (tables below; their banners name the device)"
}

for p in ${points//,/ }; do
  t0=$SECONDS
  "point_$p" || row $p FAIL "the script's check itself failed (see $W)"
  took "point ($p)" $((SECONDS - t0))
done
env_line=$($ACC env a_dev 2>/dev/null || $ACC env b_auto 2>/dev/null || echo "")

# --- the report --------------------------------------------------------------
{
  echo "# memtrain GPU report"
  echo
  if [ "$gpu" = 0 ]; then
    echo "**CPU mode — not a GPU proof.** No GPU was used ($why). Points that need a GPU: (a) CUDA vs CPU weights and world-1 NCCL vs MPI, (b) the seed-001 scenario (unet3d-v100.yaml: depth 5, instance norm, 96³, feature 48) under v100-16gb, (c) the OOM replay on the GPU, (d) fp16 with the dynamic loss scaler, (e) 2 ranks sharing one GPU and NCCL's refusal, (f) memtrain vs PyTorch on the GPU, (g) the benchmarks on the GPU, (h) 2 nodes x 1 rank on the one GPU with NCCL over sockets."
    echo
  fi
  echo "| what | value |"
  echo "| --- | --- |"
  echo "| date (UTC) | $(date -u +%Y-%m-%dT%H:%M:%SZ) |"
  echo "| host | $(hostname), $(nproc --all) cores |"
  echo "| mode | $([ "$gpu" = 1 ] && echo GPU || echo "CPU mode — not a GPU proof ($why)") |"
  echo "| GPU | $gpu_name, ${gpu_mem} MiB |"
  echo "| driver | $driver |"
  echo "| CUDA (nvcc; torch) | $nvcc_v; $torch_v |"
  echo "| LibTorch / NCCL built against | $torch_v / NCCL $nccl_v |"
  echo "| executables | $build_note $([ -n "${build_s:-}" ] && echo "(build_offline.sh took ${build_s} s in this call)") |"
  echo "| launcher | $MPIEXEC |"
  echo "| environment.json | $env_line |"
  echo "| unit and MPI tests | $ctest_sum (exit $ctest_rc, ${ctest_s} s, args: ${ctest_args:-none}) |"
  echo
  echo "| point | result | figures |"
  echo "| --- | --- | --- |"
  cat "$out/points.md"
  echo
  echo "| part | time |"
  echo "| --- | --- |"
  cat "$out/times.md"
  echo "| whole script | $((SECONDS - start)) s |"
  echo
  echo "## Details"
  cat "$out/details.md"
  echo
  echo "Runs and logs: $W."
} >"$R"
say "wrote $R ($((SECONDS - start)) s)"
if grep -q '| FAIL' "$out/points.md" || [ "$ctest_rc" != 0 ]; then exit 1; fi
