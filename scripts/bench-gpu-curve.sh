#!/usr/bin/env bash
# Issue 34's goals: Qwen2.5-Coder-1.5B as the target here, greedy, every draft planned and every
# forward priced on an H200's curve (CURVE, the 7B's by default), suffix, lookup and auto against
# plain decoding on the four workloads, the store warmed as in issue 19. One workload at a time
# (`scripts/bench-gpu-curve.sh edit-session`), or all four. The drafters' own forwards (auto's
# draft model and Jakiro) are priced on DRAFT_CURVE, the 1.5B's by default: an upper bound for
# the 0.5B draft model, and far above Jakiro's one layer. Nothing else may run beside it: the
# host time per iteration is measured here.
set -euo pipefail
cd "$(dirname "$0")/.."
CURVE=${CURVE:-../shared/gpu/curves/h200-qwen2.5-7b-q4_k_m.json}
DRAFT_CURVE=${DRAFT_CURVE:-../shared/gpu/curves/h200-qwen2.5-1.5b-q4_k_m.json}
OUT=${OUT:-docs/bench/gpu-curve/$(basename "$CURVE" .json)}
mkdir -p "$OUT"
declare -A LIMIT=([edit-session]=1 [fim-warm]=4 [humaneval-warm]=8 [chat-session]=3)
for w in "${@:-edit-session fim-warm humaneval-warm chat-session}"; do
  for w1 in $w; do
    .venv/bin/localspec bench -m qwen2.5-coder-1.5b-instruct --threads 2 --max-tokens 128 \
      --workload "$w1" --limit "${LIMIT[$w1]}" --curve "$CURVE" --draft-curve "$DRAFT_CURVE" \
      --drafter suffix --drafter lookup --drafter auto --json "$OUT/$w1.json"
  done
done
