#!/bin/bash
# Run pytest as a script's background job, the way nohup, `cmd &` in a script or a batch scheduler starts it:
# without job control the job inherits SIGINT and SIGQUIT as ignored. BUSY=N keeps N busy loops running beside it
# (killed after). Prints the job's summary line, its wall seconds and the inherited SIGINT disposition.
#
#   BUSY=2 bash benchmarks/suite_background.sh tests/test_stop_signals.py tests/search/test_many_workers.py
set -u
log=$(mktemp /tmp/suite_background.XXXXXX.log)
busy=()
for _ in $(seq 1 "${BUSY:-0}"); do
    yes > /dev/null &
    busy+=($!)
done
start=$(date +%s)
python -m pytest -q -n 0 -p no:cacheprovider "$@" > "$log" 2>&1 &   # a background job: SIGINT, SIGQUIT ignored
job=$!
python -c "import signal; print('SIGINT in a background job of this script:', signal.getsignal(signal.SIGINT))" &
wait $!
wait "$job"
code=$?
end=$(date +%s)
for pid in "${busy[@]}"; do kill "$pid"; done
echo "exit $code, $((end - start)) s, busy loops ${BUSY:-0}: $(tail -n 1 "$log")"
grep -E "^(FAILED|ERROR)" "$log" || true
echo "log: $log"
exit "$code"
