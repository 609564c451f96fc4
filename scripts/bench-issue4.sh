#!/usr/bin/env bash
# The Jakiro benchmark of docs/benchmarks.md: Qwen2.5-Coder-1.5B target, 2 threads, Jakiro
# against prompt lookup and the 0.5B draft model, each interleaved prompt by prompt with plain
# decoding; greedy on all three workloads, T = 1 on HumanEval and ShareGPT; then the
# inference-side ablations (tree shape, CEPD off, full vocabulary) on HumanEval.
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
J=${JAKIRO:-models/jakiro/qwen2.5-coder-1.5b-instruct.q8_0.gguf}
OUT=docs/bench/jakiro
mkdir -p $OUT
common=(-m qwen2.5-coder-1.5b-instruct --threads 2 --drafter lookup --drafter draft --drafter "jakiro:$J")
for t in 0 1; do
  $LS bench "${common[@]}" --temperature $t --seed 1 --workload humaneval --limit 8 --max-tokens 128 \
    --json $OUT/humaneval-t$t.json
  $LS bench "${common[@]}" --temperature $t --seed 1 --workload sharegpt --limit 8 --max-tokens 128 \
    --json $OUT/sharegpt-t$t.json
done
$LS bench "${common[@]}" --workload code-edit --limit 4 --max-tokens 256 --json $OUT/code-edit-t0.json
$LS bench -m qwen2.5-coder-1.5b-instruct --threads 2 --workload humaneval --limit 8 --max-tokens 128 \
  --drafter "jakiro:$J" --drafter "jakiro:$J,width=1,branch=1" --drafter "jakiro:$J,width=2,branch=2" \
  --drafter "jakiro:$J,cepd=off" --drafter "jakiro:$J,vocab=full" --json $OUT/ablation-humaneval.json
