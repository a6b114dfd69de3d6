#!/usr/bin/env bash
# tests/tools/skips.py on a real ctest run's JUnit file: a throwaway
# project whose tests skip in each way the suite's do (a script's line of
# each kind, ctest's SKIP_RETURN_CODE with and without a line, a gtest
# skip's message, plain and coloured as gtest colours it under mpirun, the
# same skip from two MPI ranks, a long passing output with its skip at the
# end), and one that does not skip.
# - the table names every skip once, with its kind and reason;
# - exit 1 naming the skips of kind other and the unexplained one; exit 0
#   when only machine and build skips are left.
# usage: skips_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "skips_test: $*" >&2; exit 1; }

write_project() {  # DIR TESTS...: each NAME:SHELL_COMMAND[:77]
  local dir=$1
  shift
  mkdir -p "$dir"
  {
    echo 'cmake_minimum_required(VERSION 3.20)'
    echo 'project(skips NONE)'
    echo 'enable_testing()'
    local t name cmd
    for t in "$@"; do
      name=${t%%:*} cmd=${t#*:}
      printf 'add_test(NAME %s COMMAND bash -c [=[%s]=])\n' "$name" "$cmd"
      echo "set_tests_properties($name PROPERTIES SKIP_RETURN_CODE 77)"
    done
  } >"$dir/CMakeLists.txt"
  cmake -S "$dir" -B "$dir/b" >/dev/null
  (cd "$dir/b" && ctest --output-junit "$dir/b/junit.xml" --test-output-size-passed 100000000 >/dev/null) ||
    fail "ctest failed in $dir"
}

gtest_skip='printf "%s\n" "[ RUN      ] Disk.Tmpfs" "/x/disk_test.cpp:333: Skipped" "(machine) no mount namespace" "" "[  SKIPPED ] Disk.Tmpfs (0 ms)" "[ RUN      ] Tok.Ids" "/x/tok_test.cpp:31: Skipped" "no bpe file" "" "[  SKIPPED ] Tok.Ids (1 ms)" "[  SKIPPED ] 2 tests, listed below:" "[  SKIPPED ] Disk.Tmpfs"'
write_project "$work/bad" \
  'machine:echo "SKIP (machine): no GPU"; exit 77' \
  'other:echo "SKIP: no open_clip in the venv" >&2; exit 77' \
  'silent:exit 77' \
  "gtest:$gtest_skip" \
  'ranks:echo "SKIP (build): 3 GPU-only tests (*_CUDA): a CPU build"; echo "SKIP (build): 3 GPU-only tests (*_CUDA): a CPU build"' \
  "colour:printf '\\033[0;32m[ RUN      ] \\033[mNet.Nccl\\n/x/comm_test.cpp:299: Skipped\\nno nccl here\\n\\033[0;32m[  SKIPPED ] \\033[mNet.Nccl (0 ms)\\n'" \
  'late:seq 1 20000; echo "SKIP: the reference (no h5py)"' \
  'plain:echo all compared'
rc=0
python3 "$src/tests/tools/skips.py" cpu="$work/bad/b/junit.xml" >"$work/out" 2>"$work/err" || rc=$?
cat "$work/out" "$work/err"
[ "$rc" = 1 ] || fail "exit $rc with skips of kind other, want 1"
grep -qx 'skips: 8 (allowed: machine, build; every other kind fails the test command)' "$work/out" ||
  fail "the table's head does not count 8 skips"
want=(
  'cpu  machine  machine  no GPU'
  'cpu  other  other  no open_clip in the venv'
  'cpu  silent  unexplained  SKIP_RETURN_CODE=77'
  'cpu  gtest (Disk.Tmpfs)  machine  no mount namespace'
  'cpu  gtest (Tok.Ids)  other  no bpe file'
  'cpu  ranks  build  3 GPU-only tests (*_CUDA): a CPU build'
  'cpu  late  other  the reference (no h5py)'
  'cpu  colour (Net.Nccl)  other  no nccl here'
)
squeezed=$(sed 's/   */  /g; s/^  //' "$work/out")
for w in "${want[@]}"; do
  grep -qxF "$w" <<<"$squeezed" || fail "no row '$w'"
done
for w in 'other (cpu)' 'silent (cpu)' 'gtest (Tok.Ids) (cpu)' 'late (cpu)' 'colour (Net.Nccl) (cpu)'; do
  grep -qF "$w" "$work/err" || fail "the failure does not name $w"
done
grep -qF 'machine (cpu)' "$work/err" && fail "the failure names an allowed skip"

write_project "$work/good" \
  'machine:echo "SKIP (machine): no GPU"; exit 77' \
  'plain:echo all compared'
python3 "$src/tests/tools/skips.py" cpu="$work/good/b/junit.xml" >"$work/out" ||
  fail "exit $? with only a machine skip, want 0"
grep -q 'machine  no GPU' "$work/out" || fail "the allowed skip is not in the table"
echo "skips_test: ok"
