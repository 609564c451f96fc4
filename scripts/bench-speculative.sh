#!/usr/bin/env bash
# The speculative-engine benchmark of docs/benchmarks.md: Qwen2.5-Coder-1.5B target, 2 threads,
# greedy, every configuration interleaved prompt by prompt with plain decoding and the anchors.
set -euo pipefail
cd "$(dirname "$0")/.."
LS=".venv/bin/localspec"
common=(-m qwen2.5-coder-1.5b-instruct --threads 2 --drafter lookup --drafter draft
        --anchor llama-cpp-python --anchor llama-server)
$LS bench "${common[@]}" --workload code-edit --limit 6 --max-tokens 256 \
  --json docs/bench/code-edit.json --chart docs/bench/code-edit.png
$LS bench "${common[@]}" --workload humaneval --limit 8 --max-tokens 128 \
  --json docs/bench/humaneval.json --chart docs/bench/humaneval.png
$LS bench "${common[@]}" --workload sharegpt-train --limit 8 --max-tokens 128 \
  --json docs/bench/sharegpt.json --chart docs/bench/sharegpt.png
$LS bench -m qwen2.5-coder-1.5b-instruct --threads 2 --drafter lookup --strict \
  --workload code-edit --limit 6 --max-tokens 256 --json docs/bench/code-edit-strict.json
