#!/usr/bin/env bash
# usage: check_torch_headers.sh BUILD_DIR TORCH_INCLUDE_DIR
# Passes when the compilers' dependency files under BUILD_DIR name LibTorch
# headers from TORCH_INCLUDE_DIR (the wheel's) and none from /usr/include
# (Debian's LibTorch 1.13), which sits later on the same search path.
set -euo pipefail
build=$1
include=$2
mapfile -t deps < <(find "$build" -path '*/CMakeFiles/*' -name '*.d')
[ ${#deps[@]} -gt 0 ] || { echo "no dependency files under $build: build it first" >&2; exit 1; }
debian=$(printf '%s\0' "${deps[@]}" |
  xargs -0 grep -lE '/usr/include/(torch|ATen|c10|caffe2)/' || true)
if [ -n "$debian" ]; then
  echo "Debian LibTorch headers (/usr/include) were compiled into:" >&2
  echo "$debian" >&2
  exit 1
fi
wheel=$(printf '%s\0' "${deps[@]}" | xargs -0 grep -lF "$include/torch/" | wc -l)
[ "$wheel" -gt 0 ] || { echo "no translation unit read $include/torch/" >&2; exit 1; }
echo "${#deps[@]} dependency files; $wheel read LibTorch from $include, none from /usr/include"
