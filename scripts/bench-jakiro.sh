#!/usr/bin/env bash
# The Jakiro benchmark of docs/benchmarks.md: Qwen2.5-Coder-1.5B target, 2 threads, Jakiro
# against prompt lookup and the 0.5B draft model, each interleaved prompt by prompt with plain
# decoding. First with this machine's cost curve (speed), then with --flat-cost, which plans
# as if verification batches were free (a GPU's shape), so every drafter drafts what it can
# and tau measures the drafters rather than the CPU; the inference-side ablations (CEPD off,
# full vocabulary) run that way too.
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
J=${JAKIRO:-models/jakiro/qwen2.5-coder-1.5b-instruct.q8_0.gguf}
OUT=docs/bench/jakiro
mkdir -p $OUT
common=(-m qwen2.5-coder-1.5b-instruct --threads 2 --drafter lookup --drafter draft --drafter "jakiro:$J")
$LS bench "${common[@]}" --workload humaneval --limit 8 --max-tokens 128 --json $OUT/humaneval-t0.json
$LS bench "${common[@]}" --workload sharegpt --limit 8 --max-tokens 128 --json $OUT/sharegpt-t0.json
$LS bench "${common[@]}" --workload code-edit --limit 3 --max-tokens 256 --json $OUT/code-edit-t0.json
$LS bench "${common[@]}" --flat-cost --drafter "jakiro:$J,cepd=off" --drafter "jakiro:$J,vocab=full" \
  --workload humaneval --limit 4 --max-tokens 64 --json $OUT/humaneval-t0-flat.json
$LS bench "${common[@]}" --flat-cost --temperature 1 --seed 1 --workload sharegpt --limit 4 --max-tokens 64 \
  --json $OUT/sharegpt-t1-flat.json
for w in "humaneval --limit 4 --max-tokens 64" "code-edit --limit 2 --max-tokens 128"; do
  name=${w%% *}
  $LS bench "${common[@]}" --flat-cost --temperature 1 --seed 1 --workload $w --json $OUT/$name-t1-flat.json
done
