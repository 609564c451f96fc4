#!/usr/bin/env bash
# What a fresh install's first /infill waits for: `localspec serve` on an empty LOCALSPEC_HOME
# (test store models), the time to /health ok, then three /infill requests.
#   bash scripts/first_infill.sh [MODEL]    (run from a checkout; port 8093)
cd "$(dirname "$0")/.."
export LOCALSPEC_HOME=$(mktemp -d) LOCALSPEC_MODEL_DIRS=${LOCALSPEC_MODEL_DIRS:-$HOME/.cache/localspec-test-models}
t0=$(date +%s.%N)
.venv/bin/localspec serve -m "${1:-qwen2.5-coder-0.5b-instruct}" --threads 2 --port 8093 2>/dev/null &
pid=$!
until curl -sf localhost:8093/health >/dev/null; do sleep 0.2; done
echo "health ok after $(echo "$(date +%s.%N) - $t0" | bc) s"
for i in 1 2 3; do
  curl -s -o /dev/null -w "infill $i: %{time_total} s\n" localhost:8093/infill -H 'Content-Type: application/json' \
    -d "{\"input_prefix\":\"def fib(n):\\n    \",\"input_suffix\":\"\\n\\nprint(fib($i))\\n\",\"n_predict\":16}"
done
kill $pid
wait $pid 2>/dev/null
