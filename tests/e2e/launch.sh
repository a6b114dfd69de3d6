#!/usr/bin/env bash
# The launch scripts, as far as a machine without SLURM allows: syntax,
# argument checks, the refusal outside SLURM, the requeue branch of
# train.sbatch (stub srun and scontrol on the PATH), and real training
# through both sbatch scripts with a stub srun that starts the command
# through mpirun; launches whose world MPI does not see are refused.
source "$(dirname "$0")/common.sh"
ROOT=$(cd "$TOOLS/../.." && pwd)
export MEMTRAIN_HOME=$ROOT MEMTRAIN_BIN=$MEMTRAIN

for s in "$ROOT"/launch/*.sh "$ROOT"/launch/slurm/*.sbatch; do
  bash -n "$s" || fail "syntax: $s"
done

# train.sbatch appends its log across requeues and says what its grace
# must cover, with a measured checkpoint time.
grep -q "^#SBATCH --open-mode=append$" "$ROOT/launch/slurm/train.sbatch" ||
  fail "train.sbatch does not append to its log across requeues"
grep -q "^#SBATCH --signal=USR1@[0-9]*$" "$ROOT/launch/slurm/train.sbatch" &&
  grep -q "^# .* took [0-9][0-9.-]* s" "$ROOT/launch/slurm/train.sbatch" ||
  fail "train.sbatch's --signal grace comment has no measured checkpoint time"

expect_rc() {  # WANT COMMAND...
  local want=$1 rc=0
  shift
  "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" = "$want" ] || { cat out.txt err.txt; fail "$*: exit $rc, want $want"; }
}
expect_rc 2 bash "$ROOT/launch/run.sh" -np 0
expect_rc 2 env MEMTRAIN_BIN=/nonexistent bash "$ROOT/launch/run.sh" -np 1
expect_rc 2 env -u SLURM_JOB_ID bash "$ROOT/launch/slurm/train.sbatch" cfg.yaml
grep -q "not inside a SLURM job" err.txt || fail "no refusal message"
expect_rc 2 env -u SLURM_JOB_ID bash "$ROOT/launch/slurm/scaling.sbatch"
expect_rc 2 env SLURM_JOB_ID=12345 bash "$ROOT/launch/slurm/train.sbatch"
expect_rc 2 env SLURM_JOB_ID=12345 bash "$ROOT/launch/slurm/train.sbatch" missing.yaml
grep -q "config 'missing.yaml' not found" err.txt || fail "no config message"

# Stubs: srun exits with $STUB_RC, or with "exec" starts the command as
# srun --mpi=pmix would: --ntasks ranks of one MPI world (here through
# mpirun), with SLURM_STEP_NUM_TASKS set.
mkdir -p stubs
cat >stubs/srun <<STUB
#!/usr/bin/env bash
echo "srun \$*" >>"\$STUB_LOG"
[ "\$STUB_RC" = exec ] || exit "\$STUB_RC"
n=1
while [ \$# -gt 0 ] && [[ "\$1" == -* ]]; do
  case "\$1" in --ntasks=*) n=\${1#--ntasks=} ;; esac
  shift
done
export SLURM_STEP_NUM_TASKS=\$n
exec "$MPIEXEC" --oversubscribe -np "\$n" "\$@"
STUB
cat >stubs/scontrol <<'STUB'
#!/usr/bin/env bash
echo "scontrol $*" >>"$STUB_LOG"
STUB
chmod +x stubs/*
export PATH="$PWD/stubs:$PATH" STUB_LOG="$PWD/stub.log" SLURM_JOB_ID=12345

"$MEMTRAIN" make-data --kind features --out train.h5 --samples 256 >/dev/null
cat >cfg.yaml <<'YAML'
data:
  train: train.h5
  val: ""
training:
  epochs: 1
output:
  dir: slurm_out
YAML
# srun without working PMI: each of its 4 tasks would be a world of 1.
expect_rc 2 env SLURM_NTASKS=4 SLURM_PROCID=1 "$MEMTRAIN" train --config cfg.yaml \
  --output.dir=nopmi_out
grep -q "SLURM announces 4 tasks (SLURM_NTASKS=4) but MPI sees a world of 1" err.txt ||
  { cat err.txt; fail "no launch-world message"; }
grep -q "srun --mpi=pmix" err.txt || fail "the message names no fix"
[ ! -e nopmi_out ] || fail "a refused launch wrote into output.dir"
expect_rc 2 env WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=x \
  "$MEMTRAIN" train --config cfg.yaml --output.dir=nopmi_out
grep -q "mpirun -np 2" err.txt || { cat err.txt; fail "no torchrun message"; }
echo "launch world: srun without PMI and torchrun copies refused"

for case in "3 0 requeue" "0 0 -" "1 1 -"; do
  set -- $case
  : >stub.log
  expect_rc "$2" env STUB_RC="$1" bash "$ROOT/launch/slurm/train.sbatch" cfg.yaml --training.lr=0.1
  grep -q -- "--mpi=pmix .* train --config cfg.yaml --resume auto --training.lr=0.1" stub.log || { cat stub.log; fail "srun args"; }
  if [ "$3" = requeue ]; then
    grep -q "^scontrol requeue 12345$" stub.log || { cat stub.log; fail "no requeue"; }
  else
    ! grep -q scontrol stub.log || fail "requeued on status $1"
  fi
done
echo "train.sbatch: status 3 requeues job 12345; 0 and 1 do not"
# srun gets the job's CPUs per task (since SLURM 22.05 it does not inherit
# them from sbatch: one CPU a task).
: >stub.log
expect_rc 0 env STUB_RC=0 SLURM_CPUS_PER_TASK=3 bash "$ROOT/launch/slurm/train.sbatch" cfg.yaml
grep -q -- "^srun --mpi=pmix .*--cpus-per-task=3 " stub.log || { cat stub.log; fail "srun without --cpus-per-task"; }
# srun ends the step 60 s after its first task exits (a node cut off).
grep -q -- "^srun --mpi=pmix .*--wait=60 " stub.log || { cat stub.log; fail "srun without --wait=60"; }
: >stub.log
expect_rc 0 env STUB_RC=0 MEMTRAIN_STEP_WAIT_S=0 bash "$ROOT/launch/slurm/train.sbatch" cfg.yaml
grep -q -- "^srun --mpi=pmix .*--wait=0 " stub.log || { cat stub.log; fail "MEMTRAIN_STEP_WAIT_S=0 not passed"; }

STUB_RC=exec expect_rc 0 bash "$ROOT/launch/slurm/train.sbatch" cfg.yaml
[ -f slurm_out/model.safetensors ] || fail "train.sbatch did not train"
# scaling.sbatch: bench_scaling.py through srun, ranks 1 and 2 of 2 tasks.
: >stub.log
STUB_RC=exec SLURM_NTASKS=2 MEMTRAIN_SCALING_DIR=scaling \
  expect_rc 0 bash "$ROOT/launch/slurm/scaling.sbatch" --modes weak --accum 1 \
  --micro 8 --hidden 16 --depth 1 --features 8 --windows 2 --warmup 1
[ "$(wc -l <scaling/bench_scaling.csv)" = 3 ] || { cat scaling/bench_scaling.csv; fail "bench_scaling.csv"; }
grep -q -- "^srun --mpi=pmix --ntasks=2 " stub.log || { cat stub.log; fail "scaling srun args"; }
echo "scaling.sbatch: $(cut -d, -f1-3 scaling/bench_scaling.csv | tr '\n' ' ')"
# launch/run.sh: each rank bound to floor(CPUs / N) CPUs of its own, as
# many threads (environment.json); more than one where the machine has them.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
for np in 1 2; do
  expect_rc 0 env -u OMP_NUM_THREADS -u SLURM_CPUS_PER_TASK -u SLURM_JOB_ID \
    bash "$ROOT/launch/run.sh" -np $np --config cfg.yaml --output.dir=run$np
  "$PY" - run$np/environment.json $np "$cpus" <<'PYEOF' || fail "run.sh -np $np: CPUs per rank"
import json, sys
env = json.load(open(sys.argv[1]))
np_, cpus = int(sys.argv[2]), int(sys.argv[3])
want = max(1, cpus // np_)
def count(spec):  # "0-3,6" -> 5
    return sum(int(b or a) - int(a) + 1
               for a, _, b in (p.partition("-") for p in spec.split(",")))
masks = []
for r in env["ranks"]:
    assert count(r["cpus"]) == want, (r["rank"], r["cpus"], want)
    assert r["threads"] == want, (r["rank"], r["threads"], r["threads_from"], want)
    masks.append(r["cpus"])
assert len(masks) == np_, masks
if cpus >= np_:
    assert len(set(masks)) == np_, f"ranks share CPUs: {masks}"
print(f"run.sh -np {np_}: each rank {want} CPU(s) of {cpus} and {want} thread(s): {masks}")
PYEOF
done
echo "e2e launch: ok"
