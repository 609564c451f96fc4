"""How far a better-calibrated copying drafter could go: the best a policy over what the suffix
drafter knows when it drafts could reach, against the copy ceiling's clairvoyance.

Plain greedy decoding of a workload (the store warmed and learning each answer, as the bench
does), and at every position the suffix drafter's two proposals: the request's own text
(lookup) and the store. Of each, the most-counted chain and how many of its tokens are right.
A policy sees what the drafter sees (source, matched length, the share of earlier occurrences
that went the chain's way) and picks how many tokens of that chain to verify; where both
sources propose, the longer pick runs. The per-cell picks are fitted on the answers themselves
(coordinate descent), so the figure is an upper bound for any policy over these signals, on
the cached cost curve at each position's context. Also printed: whether the target's own
confidence in the token just produced (softmax top-1) tells right store drafts from wrong ones.

    .venv/bin/python scripts/policy_bound.py humaneval-warm 16
    .venv/bin/python scripts/policy_bound.py chat-session 3
"""

import collections
import sys
from dataclasses import replace

import numpy as np

from localspec import paths
from localspec.bench import runner, workloads
from localspec.drafters.lookup import LookupDrafter
from localspec.drafters.spec import NONE
from localspec.engine import Engine, EngineConfig

MATCH = [1, 2, 3, 4, 6, 9, 17]  # cell edges: matched length, share of occurrences
SHARE = [0.0, 0.3, 0.6, 0.9]
PICKS = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24]


def chain_run(tokens, parents, counts, answer_next) -> int:
    """Right tokens along the most-counted chain from the root."""
    node, run = -1, 0
    while run < len(answer_next):
        kids = np.flatnonzero(parents == node)
        if not kids.size:
            break
        node = int(kids[np.argmax(counts[kids])])
        if tokens[node] != answer_next[run]:
            break
        run += 1
    return run


def cell(source, tokens, parents, counts, n_match, n_occ):
    share = counts[parents == -1].max() / n_occ
    return (source, max(i for i, e in enumerate(MATCH) if n_match >= e),
            max(i for i, e in enumerate(SHARE) if share >= e))


def positions(engine, prompt, answer, store, confidence):
    """Per position after the first token: (cost of batches 1..25 here, root confidence,
    [(cell, right run)] of each source that proposes)."""
    lookup = LookupDrafter()
    rows = []
    for i in range(len(answer) - 1):
        context, following = prompt + answer[:i + 1], answer[i + 1:]
        proposals = []
        lookup.sync(context)
        drafts = [("lookup", *lookup.index.draft(64, 63, 32)),
                  ("store", *store.native.draft(np.asarray(context[-31:], np.int32), 31, 64, 63, 2.0, 0.1))]
        for source, tokens, parents, counts, n_match, n_occ in drafts:
            if n_occ and len(tokens):
                proposals.append((cell(source, tokens, parents, counts, n_match, n_occ),
                                  chain_run(tokens, parents, counts, following)))
        rows.append((engine.curve.base.at(len(context)).seconds[:max(PICKS) + 1], confidence[i], proposals))
    return rows


def plain_answer(engine, prompt, max_tokens):
    """Greedy tokens and the target's top-1 probability for each."""
    ctx = engine.ctx
    ctx.clear()
    _, logits = ctx.prefill(prompt)
    answer, confidence = [], []
    while len(answer) < max_tokens:
        token = int(np.argmax(logits))
        z = np.exp(logits - logits.max())
        answer.append(token)
        confidence.append(float(z.max() / z.sum()))
        if engine.model.is_eog(token):
            break
        ctx.append(token)
        logits = ctx.logits(0)
    return answer, confidence


def speedup(answers, choose) -> float:
    """Plain seconds over a policy's: at each position choose(proposals) gives how many tokens
    to verify and how many of them are right."""
    plain = policy = 0.0
    for rows in answers:
        i = 0
        plain += sum(seconds[0] for seconds, _, _ in rows)
        while i < len(rows):
            seconds, _, proposals = rows[i]
            k, run = choose(proposals)
            policy += seconds[k]
            i += min(k, run) + 1
    return plain / policy


def simulate(answers, picks, sources) -> float:
    def choose(proposals):
        # the longer pick runs; on a tie the request's own text, as the drafter prefers it
        k, _, run = max(((picks.get(c, 0), c[0] == "lookup", r) for c, r in proposals if c[0] in sources),
                        default=(0, False, 0))
        return k, run
    return speedup(answers, choose)


def clairvoyant(answers, sources) -> float:
    def choose(proposals):
        run = min(max((r for c, r in proposals if c[0] in sources), default=0), max(PICKS))
        return run, run
    return speedup(answers, choose)


def fit(answers, sources):
    picks, best = {}, 1.0
    cells = sorted({c for rows in answers for _, _, ps in rows for c, _ in ps if c[0] in sources})
    for _ in range(3):
        for c in cells:
            for k in PICKS:
                trial = {**picks, c: k}
                speed = simulate(answers, trial, sources)
                if speed > best + 1e-9:
                    best, picks = speed, trial
    return best, picks


def main() -> None:
    workload, limit = sys.argv[1], int(sys.argv[2])
    max_tokens = 128
    prompts, warm = workloads.load_warm(workload, limit)
    engine = Engine(replace(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2, drafter=NONE),
                            store=":memory:"))
    store = engine.drafters.suffix_store(":memory:")
    for doc in runner.warm_documents(engine, warm, max_tokens, paths.cache_dir() / "bench" / "answers.json"):
        store.add(doc)
    answers = []
    for p in prompts:
        steps = runner.turns(engine, p)
        prompt = next(steps)
        while prompt is not None:
            answer, confidence = plain_answer(engine, prompt, max_tokens)
            answers.append(positions(engine, prompt, answer, store, confidence))
            store.add([t for t in answer if not engine.model.is_eog(t)])
            text = engine.model.detokenize([t for t in answer if not engine.model.is_eog(t)])
            try:
                prompt = steps.send(text) if p.kind == "session" else None
            except StopIteration:
                prompt = None
        print(f"{p.id}: {len(answers)} answers", file=sys.stderr)

    n = sum(len(rows) for rows in answers)
    print(f"{workload} ({limit}): {len(answers)} answers, {n} positions; cost curve: batch 2 "
          f"{engine.curve.base.cost(2) / engine.curve.base.cost(1):.2f}x, 4 "
          f"{engine.curve.base.cost(4) / engine.curve.base.cost(1):.2f}x a single token\n")
    print("| drafts from | best policy over the drafter's signals (in-sample) | clairvoyant on the same chains |")
    print("|---|---:|---:|")
    for sources in (("lookup",), ("store",), ("lookup", "store")):
        best, _ = fit(answers, sources)
        print(f"| {' + '.join(sources)} | {best:.3f}× | {clairvoyant(answers, sources):.3f}× |")

    # Does the target's confidence in the root add to what the match says?
    edges = [0.0, 0.5, 0.8, 0.95, 0.99]
    table = collections.defaultdict(list)
    for rows in answers:
        for _, confidence, proposals in rows:
            for c, run in proposals:
                if c[0] == "store":
                    table[c[1], max(i for i, e in enumerate(edges) if confidence >= e)].append(run > 0)
    print("\nstore drafts: first token right (share, count) by matched length (rows) and the target's "
          "top-1 probability for the token just produced (columns)\n")
    print("| matched | " + " | ".join(f"p ≥ {e}" for e in edges) + " |")
    print("|---|" + "---:|" * len(edges))
    for m in range(len(MATCH) - 1):
        cells = [table.get((m, j), []) for j in range(len(edges))]
        print(f"| {MATCH[m]}–{MATCH[m + 1] - 1} | " + " | ".join(
            f"{np.mean(v):.2f} ({len(v)})" if v else "-" for v in cells) + " |")


if __name__ == "__main__":
    main()
