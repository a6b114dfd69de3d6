#!/usr/bin/env bash
# The main job: install what is missing, build, make a small synthetic
# dataset, and train it with 2 MPI ranks on the built-in default config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install_deps.sh
bash launch/build.sh --target memtrain
./build/memtrain make-data --kind features --out runs/data/train.h5 --samples 32768
./build/memtrain make-data --kind features --out runs/data/val.h5 --samples 4096 --split val
# Its own folder, replaced on every run (a fresh run into another run's
# output.dir is refused unless told to overwrite it).
bash launch/run.sh -np 2 --output.dir=runs/quickstart --output.overwrite=true "$@"
