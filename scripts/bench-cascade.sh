#!/usr/bin/env bash
# The Cascade benchmark of docs/benchmarks.md: Qwen2.5-Coder-1.5B target, 2 threads; auto
# (Cascade over prompt lookup, the 0.5B draft model and the shipped Jakiro drafter) against
# static K for lookup and the draft model, each interleaved prompt by prompt with plain
# decoding, on each workload, on the mixed one, and on an adversarial one (open-ended chat at
# temperature 1.5, where drafts keep failing).
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
OUT=${OUT:-docs/bench/cascade}  # another folder for a later run (OUT=docs/bench/cascade/run4)
mkdir -p $OUT
# Static K for lookup at 1, 2, 3, 4, 8; for the draft model at 2, 4, 8 only: on this CPU it is
# far below plain at every K (0.3-0.65x in the first run, K = 1 the worst), and its runs are slow.
configs=(--drafter auto)
for k in 1 2 3 4 8; do configs+=(--drafter lookup@$k); done
for k in 2 4 8; do configs+=(--drafter draft@$k); done
run() {  # name, then bench arguments
  local name=$1; shift
  $LS bench -m qwen2.5-coder-1.5b-instruct --threads 2 "${configs[@]}" "$@" \
    --json $OUT/$name.json --trace $OUT/$name-trace.png
}
if [ "${1:-}" = "--long" ]; then
  # Twice the prompts where the first runs came within this machine's noise (a request's speed
  # varies by about 8% run to run): the mix and the adversarial workload. The draft model at
  # static K is left out (0.36-0.58x in every first run) and Jakiro at static K comes in.
  configs=(--drafter auto)
  for k in 1 2 3 4 8; do configs+=(--drafter lookup@$k); done
  for k in 1 2 4; do configs+=(--drafter jakiro@$k); done
  run mix-long --workload mix --limit 12 --max-tokens 64
  run adversarial-long --workload sharegpt --limit 6 --max-tokens 96 --temperature 1.5 --seed 1
  exit
fi
run humaneval --workload humaneval --limit 3 --max-tokens 96
run code-edit --workload code-edit --limit 2 --max-tokens 128
run sharegpt --workload sharegpt --limit 3 --max-tokens 96
run mix --workload mix --limit 6 --max-tokens 64
run adversarial --workload sharegpt --limit 3 --max-tokens 96 --temperature 1.5 --seed 1
