#!/usr/bin/env bash
# The Jakiro drafter that ships for SmolLM2-135M-Instruct (models/jakiro/), and its tau
# (docs/benchmarks.md): 100k corpus tokens (half ShareGPT's training part, half Python),
# sequences of 512, 2 epochs, lr 5e-4; then tau with --flat-cost against prompt lookup.
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
RUN=${RUN:-/work/runs/smollm2-jakiro}
$LS train jakiro --target smollm2-135m-instruct --out $RUN --max-tokens 100000 --seq-len 512 \
  --epochs 2 --lr 5e-4 --threads 2
$LS convert $RUN/checkpoint.pt models/jakiro/smollm2-135m-instruct.q8_0.gguf --type q8_0
cp $RUN/loss.png docs/jakiro-smollm2-loss.png
for t in 0 1; do
  $LS bench -m smollm2-135m-instruct --threads 2 --flat-cost --temperature $t --seed 1 \
    --drafter lookup --drafter jakiro --workload humaneval --limit 6 --max-tokens 64 \
    --json docs/bench/jakiro/smollm2-humaneval-t$t-flat.json
  $LS bench -m smollm2-135m-instruct --threads 2 --flat-cost --temperature $t --seed 1 \
    --drafter lookup --drafter jakiro --workload sharegpt --limit 6 --max-tokens 64 \
    --json docs/bench/jakiro/smollm2-sharegpt-t$t-flat.json
done
