#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit, MPI with 1, 2
# and 4 ranks, end-to-end) and each benchmark at its smallest size.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install_deps.sh
bash launch/build.sh
source launch/env.sh
cd build
ctest --output-on-failure
