#!/usr/bin/env bash
# Prepare, on a machine with the package registries, what the GPU check needs on a lent GPU
# machine that reaches none: in .whl/ the wheels its image lacks (for its Python 3.12), one
# version of each (the folder is emptied first), and in .gpu_data/ the hippocampus set (the
# training call's data; HIPPOCAMPUS=PATH names another copy) and MONAI's official algorithm
# templates (call A's MONAI DiNTS section; MONAI_TEMPLATES=PATH names another copy; 0.7 MB). Both
# folders are git-ignored: name them in the device tool's `carry` (docs/gpu-check.md). Then run
# benchmarks/gpu_run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
src="${HIPPOCAMPUS:-../shared/datasets/Task04_Hippocampus}"
if [ ! -f "$src/dataset.json" ]; then
  echo "gpu_prepare: error: $src/dataset.json not found; set HIPPOCAMPUS to the Task04_Hippocampus folder" >&2
  exit 2
fi
templates="${MONAI_TEMPLATES:-../shared/monai/algorithm_templates}"
if [ ! -f "$templates/dints/scripts/algo.py" ]; then
  echo "gpu_prepare: error: $templates/dints/scripts/algo.py not found; set MONAI_TEMPLATES to MONAI's algorithm_templates folder" >&2
  exit 2
fi
rm -rf .whl
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  monai==1.6.1 optuna==5.0.0 sqlalchemy==2.1.9 alembic mako colorlog nibabel==5.4.2 greenlet fire termcolor
rm -rf .gpu_data
mkdir -p .gpu_data
cp -r "$src" .gpu_data/Task04_Hippocampus
mkdir -p .gpu_data/monai
cp -r "$templates" .gpu_data/monai/algorithm_templates
du -sh .whl .gpu_data
total_kib=$(du -sk .whl .gpu_data | awk '{s += $1} END {print s}')
if [ "$total_kib" -gt 60000 ]; then
  echo "gpu_prepare: warning: .whl and .gpu_data hold ${total_kib} KiB; the device tool carries 64 MiB with the tree" >&2
fi
