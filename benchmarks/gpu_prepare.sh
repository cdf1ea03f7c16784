#!/usr/bin/env bash
# Prepare, on a machine with the package registries, what the GPU check needs on a lent GPU
# machine that reaches none: wheels of the packages its image lacks (for its Python 3.12)
# in .whl/, and the hippocampus set in .gpu_data/. Both folders are git-ignored through
# .git/info/exclude; name them in the device tool's `carry`. Then run benchmarks/gpu_run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
for d in /.whl/ /.gpu_data/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  monai==1.6.1 optuna==5.0.0 sqlalchemy==2.1.9 alembic mako colorlog nibabel==5.4.2 greenlet
src="${HIPPOCAMPUS:-../shared/datasets/Task04_Hippocampus}"
if [ -d "$src" ]; then
  mkdir -p .gpu_data && rm -rf .gpu_data/Task04_Hippocampus && cp -r "$src" .gpu_data/
else
  echo "warning: $src not found; the check will run on the synthetic CT set only" >&2
fi
du -sh .whl .gpu_data 2>/dev/null || true
