#!/usr/bin/env bash
# On the lent GPU machine (device tool, carry [".whl", ".gpu_data"]): install the carried
# wheels beside its CUDA torch, run the GPU check into $OUT, then the CUDA tests.
#   bash benchmarks/gpu_run.sh [SECTIONS] [DEADLINE_S] [PYTEST: 0|1]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$OUT/nvidia_smi.txt"
sections="${1:-env,probes,calibrate,tune_train,fast_regular,precision,ddp}"
deadline="${2:-480}"
python3 benchmarks/gpu_check.py --out "$OUT" --hippocampus .gpu_data/Task04_Hippocampus \
  --sections "$sections" --deadline "$deadline" 2>&1 | tee "$OUT/gpu_check_console.txt"
rc=${PIPESTATUS[0]}
if [ "${3:-0}" = 1 ]; then
  python3 -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_cuda.txt"
fi
exit "$rc"
