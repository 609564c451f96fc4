#!/usr/bin/env bash
# The acceptance-head benchmark of docs/benchmarks.md: the 0.5B draft model drafting for
# Qwen2.5-Coder-1.5B (2 threads) at static K, cost-aware without a head (its own
# probabilities, calibrated), and cost-aware with the head trained for the pair
# (`localspec train acceptance-head`), interleaved prompt by prompt with plain decoding.
# Twice: on this CPU's cost curve, and with --flat-cost (planning as if verification were as
# cheap as one forward, a GPU's shape), where the head, not the CPU, decides the lengths.
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
OUT=docs/bench/acceptance-head
mkdir -p $OUT
configs=(--drafter draft@1 --drafter draft@2 --drafter draft@4 --drafter draft,head=off --drafter draft,head=on)
run() {  # name, then bench arguments
  local name=$1; shift
  $LS bench -m qwen2.5-coder-1.5b-instruct --threads 2 "${configs[@]}" "$@" --json $OUT/$name.json
}
run humaneval --workload humaneval --limit 3 --max-tokens 96
run humaneval-flat --workload humaneval --limit 3 --max-tokens 96 --flat-cost
run sharegpt-flat --workload sharegpt --limit 3 --max-tokens 96 --flat-cost
