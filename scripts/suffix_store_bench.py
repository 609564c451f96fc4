"""The suffix store at scale: its size, the time to learn an answer, to open it, and to draft
from it, at 10,000 and 100,000 stored answers, against one forward of the target.

Answers are ShareGPT's assistant turns (cut into pieces of at most 150 tokens, taken in order
until there are enough), tokenized by the target's tokenizer; drafting contexts are the first
tokens of held-out answers (the evaluation tail), cut at random points; "propose" is one
iteration's, the request's text indexed up to the token before, as in the loop.

    .venv/bin/python scripts/suffix_store_bench.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from localspec import paths, store
from localspec.datasets import N_SHAREGPT_TRAIN, sharegpt_conversations
from localspec.drafters.base import Budget
from localspec.drafters.suffix import SuffixDrafter, SuffixStore
from localspec.llama import Model
from localspec.llama.cost import CostCurve


def answers(model: Model, n: int, lo: int, hi: int, piece: int = 150):
    """Up to n token pieces of the assistant turns of conversations lo..hi."""
    out = []
    for idx, conv in enumerate(itertools.islice(sharegpt_conversations(), hi)):
        if idx < lo:
            continue
        for turn in conv.get("conversations") or []:
            if turn.get("from") == "gpt" and turn.get("value"):
                tokens = model.tokenize(turn["value"], add_special=False, parse_special=False)
                out += [tokens[i:i + piece] for i in range(0, len(tokens), piece) if len(tokens[i:i + piece]) >= 8]
                if len(out) >= n:
                    return out[:n]
    return out


def target_curve(model_path: Path) -> CostCurve:
    """The cached cost curve of the target with the cheapest single-token forward (measured by
    `localspec cost`)."""
    found = []
    for f in (paths.cache_dir() / "cost").glob("*.json"):
        data = json.loads(f.read_text())
        if Path(data.get("model", "")) == model_path:
            found.append(CostCurve(data["seconds"], data["n_context"]))
    if not found:
        sys.exit(f"no cost curve for {model_path.stem}: run `localspec cost -m {model_path.stem}` first")
    return min(found, key=lambda c: c.seconds[0])


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--queries", type=int, default=2000)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    path = store.resolve(a.model)
    curve = target_curve(path)
    with Model(path, vocab_only=True) as model:
        t0 = time.perf_counter()
        docs = answers(model, max(sizes), 0, N_SHAREGPT_TRAIN)
        held_out = answers(model, 400, N_SHAREGPT_TRAIN, N_SHAREGPT_TRAIN + 3000)
        print(f"tokenized {len(docs):,} answers ({sum(map(len, docs)):,} tokens) in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
        key = model.tokenizer_hash
    if len(docs) < max(sizes):
        print(f"only {len(docs):,} answer pieces: sizes capped", file=sys.stderr)
    rng = random.Random(0)
    contexts = []
    for _ in range(a.queries):
        d = rng.choice(held_out)
        contexts.append(d[:rng.randint(4, len(d))])
    budget = Budget(curve, n_seq_max=8)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        s = SuffixStore(directory, key, max_bytes=1 << 40)
        added = 0
        for size in sorted(sizes):
            add_times = []
            for doc in docs[added:size]:
                t = time.perf_counter()
                s.add(doc)
                add_times.append(time.perf_counter() - t)
            added = min(size, len(docs))
            t = time.perf_counter()
            s.close()
            t_snapshot = time.perf_counter() - t
            t = time.perf_counter()
            s = SuffixStore(directory, key, max_bytes=1 << 40)
            t_open = time.perf_counter() - t
            drafter = SuffixDrafter(s)
            native, full, hits = [], [], 0
            for ctx in contexts:
                arr = np.asarray(ctx[-drafter.max_match:], np.int32)
                t = time.perf_counter()
                tokens, *_ = s.native.draft(arr, drafter.max_match, budget.max_nodes, drafter.max_depth, drafter.alpha,
                                            drafter.min_share)
                native.append(time.perf_counter() - t)
                hits += len(tokens) > 0
                # As in the loop: the request's context was indexed last iteration, one token ago.
                drafter.propose(ctx[:-1], budget)
                t = time.perf_counter()
                drafter.propose(ctx, budget)
                full.append(time.perf_counter() - t)
            disk = sum(f.stat().st_size for f in directory.iterdir())
            rows.append({
                "answers": added, "tokens": int(s.native.n_tokens), "memory_mb": s.native.bytes / 1e6,
                "disk_mb": disk / 1e6, "add_ms_median": 1e3 * statistics.median(add_times),
                "add_ms_p99": 1e3 * percentile(add_times, 99), "snapshot_s": t_snapshot, "open_s": t_open,
                "draft_us_median": 1e6 * statistics.median(native), "draft_us_p99": 1e6 * percentile(native, 99),
                "propose_us_median": 1e6 * statistics.median(full), "propose_us_p99": 1e6 * percentile(full, 99),
                "share_of_forward_median": statistics.median(full) / curve.seconds[0],
                "drafted": hits / len(contexts)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(f"| answers | tokens | memory | on disk | learn one (median / p99) | snapshot | open | "
          f"draft, native (median / p99) | propose, whole (median / p99) | share of a target forward "
          f"({1e3 * curve.seconds[0]:.0f} ms) | contexts drafted for |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['answers']:,} | {r['tokens']:,} | {r['memory_mb']:.0f} MB | {r['disk_mb']:.0f} MB | "
              f"{r['add_ms_median']:.2f} / {r['add_ms_p99']:.1f} ms | {r['snapshot_s']:.1f} s | "
              f"{r['open_s']:.2f} s | {r['draft_us_median']:.0f} / {r['draft_us_p99']:.0f} µs | "
              f"{r['propose_us_median']:.0f} / {r['propose_us_p99']:.0f} µs | "
              f"{r['share_of_forward_median']:.2%} | {r['drafted']:.0%} |")


if __name__ == "__main__":
    main()
