#!/usr/bin/env bash
# The Jakiro ablations of docs/benchmarks.md: drafters for Qwen2.5-Coder-1.5B trained the same
# way on one shared feature cache (99,241 tokens, 2 epochs, lr 5e-4, sequences of 512, draft
# vocabulary counted over the trained tokens), differing only in the experts: N-K 2-2 (the
# paper's default), 3-2, 4-2, and the single-expert EAGLE-style baseline. Then tau for each with
# --flat-cost (plans as if verification were free, so tau measures the drafter, not this CPU)
# and the Token Diversity Index (paper eq. 18) of 2-2 against the single expert.
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
RUNS=${RUNS:-/work/runs}
FEATURES=${FEATURES:-$RUNS/qwen15-jakiro/features}
OUT=docs/bench/jakiro
mkdir -p $OUT
for experts in 2 3 4 1; do
  run=$RUNS/ablation-experts-$experts
  $LS train jakiro --target qwen2.5-coder-1.5b-instruct --out $run --features $FEATURES \
    --max-tokens 99241 --seq-len 512 --epochs 2 --lr 5e-4 --experts $experts --threads 2
  $LS convert $run/checkpoint.pt $run/drafter.q8_0.gguf --type q8_0
done
drafters=()
for experts in 2 3 4 1; do drafters+=(--drafter "jakiro:$RUNS/ablation-experts-$experts/drafter.q8_0.gguf"); done
$LS bench -m qwen2.5-coder-1.5b-instruct --threads 2 --flat-cost "${drafters[@]}" \
  --workload humaneval --limit 4 --max-tokens 64 --json $OUT/ablation-humaneval-t0-flat.json
$LS bench -m qwen2.5-coder-1.5b-instruct --threads 2 --flat-cost "${drafters[@]}" \
  --temperature 1 --seed 1 --workload sharegpt --limit 4 --max-tokens 64 \
  --json $OUT/ablation-sharegpt-t1-flat.json
for experts in 2 1; do
  .venv/bin/python scripts/jakiro_tdi.py --drafter "jakiro:$RUNS/ablation-experts-$experts/drafter.q8_0.gguf" \
    --workload humaneval --limit 4 --max-tokens 64
done
