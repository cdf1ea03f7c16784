#!/usr/bin/env bash
# On the lent GPU machine (the device tool's `run`; docs/gpu-check.md gives the exact commands):
#   bash benchmarks/gpu_run.sh memory   [DEADLINE_S]   # call A: carry [".whl", ".gpu_data"]
#   bash benchmarks/gpu_run.sh training [DEADLINE_S]   # call B: carry [".whl", ".gpu_data"]
#   bash benchmarks/gpu_run.sh cuda-tests              # tests/test_cuda.py (marker cuda): carry [".whl"]
# Checks the carried files before anything else, installs the wheels beside the image's CUDA
# torch, runs the call into $OUT and exits with its code (1: a section failed, 2: bad input,
# 3: the deadline cut a section). DEADLINE_S (default 330 for memory, 300 for training) ends the
# call inside 6 minutes with the wheel install.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check_out}"
mkdir -p "$OUT"
fail() { echo "gpu_run: error: $*" | tee -a "$OUT/gpu_run_error.txt" >&2; exit 2; }
call="${1:-}"
case "$call" in memory|training|cuda-tests) ;; *) fail "give the call: memory, training or cuda-tests";; esac
ls .whl/*.whl > /dev/null 2>&1 || fail ".whl/ holds no wheels: run benchmarks/gpu_prepare.sh and name .whl in carry"
dups=$(for f in .whl/*.whl; do basename "$f" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'; done | sort | uniq -d)
[ -z "$dups" ] || fail "two versions of '$dups' in .whl/: run benchmarks/gpu_prepare.sh again (it empties .whl/ first)"
if [ "$call" = training ]; then
  [ -f .gpu_data/Task04_Hippocampus/dataset.json ] \
    || fail ".gpu_data/Task04_Hippocampus/dataset.json is missing: run benchmarks/gpu_prepare.sh and name .gpu_data in carry"
fi
if [ "$call" = memory ]; then
  [ -f .gpu_data/monai/algorithm_templates/dints/scripts/algo.py ] \
    || fail ".gpu_data/monai/algorithm_templates is missing (MONAI's DiNTS section): run benchmarks/gpu_prepare.sh and name .gpu_data in carry"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || fail "the wheel install failed"
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > "$OUT/nvidia_smi.txt" 2>&1
cat "$OUT/nvidia_smi.txt"
if [ "$call" = cuda-tests ]; then
  python3 -m pytest -q -n 0 -m cuda tests/test_cuda.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_cuda.txt"
  exit "${PIPESTATUS[0]}"
fi
extra=()
[ "$call" = training ] && extra+=(--hippocampus .gpu_data/Task04_Hippocampus)
[ -n "${2:-}" ] && extra+=(--deadline "$2")
python3 -m benchmarks.gpu_check "$call" --out "$OUT" "${extra[@]}" 2>&1 \
  | tee "$OUT/gpu_check_${call}_console.txt"
exit "${PIPESTATUS[0]}"
