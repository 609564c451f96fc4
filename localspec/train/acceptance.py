"""Acceptance-head training (Sun et al., "Acceptance-Guided Adaptive Speculative Decoding",
section 2.3): data from the target and the draft model, a weighted binary cross-entropy fit,
a calibration report.

Data, per training prompt (chat turns and code from the drafters' corpus, never evaluation
data): (1) the target samples a continuation y at T = 1; (2) the draft model, given y's
prefixes, samples its own token at each position, and a mixed sequence keeps a random half of
y's tokens and takes the draft's for the rest (token mixing: the head then also sees states
after draft tokens, as inside a drafted chain, against over-confidence); (3) on the mixed
sequence, one batched forward of each model gives, per position, the draft's hidden state f,
its distribution q and the target's p. Each position yields two rows: the draft's top token
and a token drawn from q, with both labels, min(1, p(x) / q(x)) (acceptance at T > 0) and
[x = argmax p] (at T = 0); a head is trained for one of them. The head reads f and the
draft's probability of the token (siblings in a tree share f: q(x) tells them apart).

Sequences are stored one file each as they are made, so collection resumes; of every ten,
eight train, one decides early stopping and one is held out for the calibration report."""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from localspec.drafters.acceptance_head import HEAD_SAMPLING
from localspec.drafters.files import is_jakiro
from localspec.drafters.draft_model import check_same_vocabulary
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.errors import LocalspecError
from localspec.loop import generate
from localspec.paths import replacing
from localspec.progress import progress_bar
from localspec.sampling import TokenSampler
from localspec.train.corpus import training_examples

LABELS = ("greedy", "sampled")  # which acceptance a head predicts: at T = 0 or at T > 0


@dataclass(frozen=True)
class HeadTrainConfig:
    target: Path
    drafter: Path
    out: Path
    n_sequences: int = 160    # target continuations to collect
    max_new: int = 96         # tokens per continuation
    max_prompt: int = 384     # prompt tokens kept (the end of longer ones)
    label: str = "greedy"
    hidden: int = 128         # width of the head's residual blocks
    n_blocks: int = 1
    epochs: int = 20
    lr: float = 2e-3
    seed: int = 0
    n_threads: int = 0


def prompts(model: Model, n: int, max_prompt: int) -> list[list[int]]:
    """Training prompts: a chat up to its first assistant turn, or a code file's first 64
    tokens (the target continues it)."""
    out = []
    for ex in training_examples(model, max_tokens=1024):
        start = int(np.argmax(ex.mask)) if ex.id.startswith("sharegpt/") else 64
        if 0 < start < len(ex.tokens):
            out.append(ex.tokens[:start][-max_prompt:].tolist())
        if len(out) == n:
            break
    return out


def _rows(ctx: Context, tokens: list[int], n: int) -> int:
    """Decode `tokens` afresh with outputs for the last n; the first output's row."""
    ctx.clear()
    last = ctx.extend(tokens, n_outputs=n)
    return last - n + 1


def collect(cfg: HeadTrainConfig, texts: list[str] | None = None) -> Path:
    """Collect (or finish collecting) the training data into OUT/data; from the corpus's
    prompts, or from `texts` (plain completions) when given."""
    data = cfg.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    target = Model(cfg.target)
    n_ctx = cfg.max_prompt + cfg.max_new + 8
    closing = [target]
    try:
        if is_jakiro(cfg.drafter):
            from localspec.drafters.jakiro import JakiroRuntime
            rt = JakiroRuntime(cfg.drafter, target, n_ctx=n_ctx, n_threads=cfg.n_threads)
            tctx = Context(target, ContextConfig(n_ctx=n_ctx, n_threads=cfg.n_threads, n_batch=n_ctx,
                                                 embeddings=True))
            closing.append(tctx)
            sequence = functools.partial(_jakiro_sequence, tctx, rt, cfg=cfg)
            drafter_name, d_model, kind = cfg.drafter.stem, rt.cfg.d_model, "jakiro"
        else:
            draft = Model(cfg.drafter)
            closing.append(draft)
            check_same_vocabulary(target, draft)
            tctx = Context(target, ContextConfig(n_ctx=n_ctx, n_threads=cfg.n_threads, n_batch=n_ctx))
            dctx = Context(draft, ContextConfig(n_ctx=n_ctx, n_threads=cfg.n_threads, n_batch=n_ctx,
                                                embeddings=True))
            closing += [tctx, dctx]
            sequence = functools.partial(_sequence, tctx, dctx, cfg=cfg)
            drafter_name, d_model, kind = draft.name, draft.n_embd, "draft"
        (cfg.out / "meta.json").write_text(json.dumps({
            "target": target.name, "drafter": drafter_name, "target_file": target.path.stem,
            "drafter_file": cfg.drafter.stem, "drafter_kind": kind,
            "tokenizer": target.tokenizer_hash, "d_model": d_model}))
        chosen = [target.tokenize(t) for t in texts] if texts else \
            prompts(target, cfg.n_sequences, cfg.max_prompt)
        todo = [(i, p) for i, p in enumerate(chosen)
                if not (data / f"seq-{i:05d}.npz").exists()]
        with progress_bar("acceptance data", len(todo), unit="sequences") as advance:
            for i, prompt in todo:
                rows = sequence(prompt, seed=cfg.seed * 100_003 + i)
                if rows is not None:
                    with replacing(data / f"seq-{i:05d}.npz") as tmp, open(tmp, "wb") as f:
                        np.savez(f, **rows)
                advance(1)
    finally:
        for c in reversed(closing):
            c.close()
    return data


def _jakiro_sequence(tctx: Context, rt, prompt: list[int], cfg: HeadTrainConfig, seed: int):
    """As _sequence, for a Jakiro drafter: the target's continuation y, then the mixed
    sequence (half of y, half Jakiro's own tokens), and on it, per position, each of the two
    branch features (u + e_a, u + e_b: what the tree reads and draft heads score) with its q
    over the drafter's vocabulary. The drafter runs teacher-forced on the target's features
    (depth 1 of a tree; deeper nodes read the drafter's own features, which this data does
    not cover)."""
    at_t1 = replace(HEAD_SAMPLING, seed=seed)
    y = generate(tctx, prompt, cfg.max_new, at_t1, stop_at_eog=False)
    n = len(y)
    if n < 2 or len(prompt) < 2:
        return None
    rng = np.random.default_rng(seed)
    draw = TokenSampler(at_t1)
    ids = np.asarray(rt.draft_vocab)
    _, q_branches, _ = _jakiro_branches(tctx, rt, prompt + y[:-1], n)
    own = [int(ids[rng.choice(len(ids), p=q)]) for q in q_branches[:, 0]]
    mixed = [a if keep else b for a, b, keep in zip(y, own, rng.random(n) < 0.5)]
    branches, q_branches, p_rows = _jakiro_branches(tctx, rt, prompt + mixed[:-1], n)
    feats, q_x, acc_sampled, acc_greedy = [], [], [], []
    for j in range(n):
        logits = tctx.logits(p_rows[j])
        p_ids, p_probs = draw.distribution(logits)
        p_top = int(np.argmax(logits))
        for f, q in zip(branches[j], q_branches[j]):
            for i in (int(np.argmax(q)), int(rng.choice(len(q), p=q))):
                x = int(ids[i])
                p = float(p_probs[p_ids == x][0]) if (p_ids == x).any() else 0.0
                feats.append(f.astype(np.float16))
                q_x.append(float(q[i]))
                acc_sampled.append(min(1.0, p / float(q[i])))
                acc_greedy.append(float(x == p_top))
    return {"feats": np.stack(feats), "q": np.asarray(q_x, np.float32),
            "sampled": np.asarray(acc_sampled, np.float32), "greedy": np.asarray(acc_greedy, np.float32)}


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, at T = 1 (what the tree's candidates carry as q)."""
    e = np.exp(logits.astype(np.float64) - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _jakiro_branches(tctx: Context, rt, seq: list[int], n: int):
    """Decode seq (prompt + the continuation's first n - 1 tokens) with the target, then run
    the drafter over the last positions as drafting would (a cache seeded with up to
    `feature_window` positions before). Returns, per continuation token j: its two branch
    features (n, 2, d), their q over the drafter's vocabulary (n, 2, V), and the target's
    batch row whose logits predict it."""
    from localspec.drafters.jakiro import JakiroDrafter
    P = len(seq) - n + 1  # the continuation's first position
    first_pos = max(0, P - 2 - JakiroDrafter.feature_window)
    m = len(seq) - first_pos
    first_row = _rows(tctx, seq, m)  # outputs for positions first_pos..len(seq) - 1
    # Row of position p: first_row + p - first_pos. Drafter position p reads p's feature and
    # the token at p + 1 and predicts p + 2; the continuation's token j sits at P + j.
    pos = np.arange(first_pos, len(seq) - 1)
    feats = np.stack([tctx.hidden(first_row + p - first_pos) for p in pos])
    rt.truncate(0)
    mask = np.triu(np.full((len(pos), len(pos)), -np.inf, np.float32), 1)
    u, experts, router = rt.layer(feats, [seq[p + 1] for p in pos], pos, mask)
    rt.truncate(0)
    rows = np.arange(n) + P - 2 - first_pos  # the drafter's row predicting token j
    top2 = np.argsort(-router[rows], axis=1, kind="stable")[:, :2] if router.shape[1] > 1 else \
        np.zeros((n, 2), int)
    branches = u[rows, None] + experts[rows[:, None], top2]  # (n, 2, d): u + e_a, u + e_b
    q = _softmax(rt.logits(branches.reshape(2 * n, -1))).reshape(n, 2, -1)
    return branches, q, first_row + rows + 1


def _sequence(tctx: Context, dctx: Context, prompt: list[int], cfg: HeadTrainConfig, seed: int):
    at_t1 = replace(HEAD_SAMPLING, seed=seed)
    y = generate(tctx, prompt, cfg.max_new, at_t1, stop_at_eog=False)
    n = len(y)
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    draw = TokenSampler(at_t1)
    # The draft's own token at each position of y, then the mixed sequence.
    first = _rows(dctx, prompt + y[:-1], n)
    own = [draw.sample(dctx.logits(first + j)) for j in range(n)]
    mixed = [a if keep else b for a, b, keep in zip(y, own, rng.random(n) < 0.5)]
    seq = prompt + mixed[:-1]
    first_t = _rows(tctx, seq, n)
    p_top = np.array([int(np.argmax(tctx.logits(first_t + j))) for j in range(n)])
    p_dist = [draw.distribution(tctx.logits(first_t + j)) for j in range(n)]
    first_d = _rows(dctx, seq, n)
    feats, q_x, acc_sampled, acc_greedy = [], [], [], []
    for j in range(n):
        ids, probs = draw.distribution(dctx.logits(first_d + j))
        f = dctx.hidden(first_d + j).astype(np.float16)
        for x in (int(ids[0]), draw.sample(dctx.logits(first_d + j))):
            q = float(probs[ids == x][0]) if (ids == x).any() else 0.0
            if q <= 0:
                continue
            p_ids, p_probs = p_dist[j]
            p = float(p_probs[p_ids == x][0]) if (p_ids == x).any() else 0.0
            feats.append(f)
            q_x.append(q)
            acc_sampled.append(min(1.0, p / q))
            acc_greedy.append(float(x == p_top[j]))
    return {"feats": np.stack(feats), "q": np.asarray(q_x, np.float32),
            "sampled": np.asarray(acc_sampled, np.float32), "greedy": np.asarray(acc_greedy, np.float32)}


# Sequence i is for training, early stopping or the held-out report by i % 10.
PARTS = {"train": range(8), "validation": (8,), "held-out": (9,)}


def load(data: Path, label: str, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, q, labels) of one part of the sequences (see PARTS)."""
    files = [f for f in sorted(data.glob("seq-?????.npz")) if int(f.stem[4:]) % 10 in PARTS[part]]
    if not files:
        raise LocalspecError(f"no {part} acceptance data in {data} (collect more sequences)")
    parts = [np.load(f) for f in files]
    return (np.concatenate([p["feats"] for p in parts]).astype(np.float32),
            np.concatenate([p["q"] for p in parts]), np.concatenate([p[label] for p in parts]))


def train_head(cfg: HeadTrainConfig) -> Path:
    """Fit the head on the collected data; write OUT/head-LABEL.pt and its reliability
    diagram OUT/reliability-LABEL.png (held-out sequences)."""
    import torch

    from localspec.train.acceptance_net import AcceptanceNet, head_inputs
    if cfg.label not in LABELS:
        raise LocalspecError(f"label must be one of {', '.join(LABELS)} (got {cfg.label})")
    torch.manual_seed(cfg.seed)
    data = cfg.out / "data"
    (f, q, y), (fv, qv, yv), (fe, qe, ye) = (load(data, cfg.label, part) for part in PARTS)
    x, xv, xe = (head_inputs(torch.from_numpy(a), torch.from_numpy(b)) for a, b in ((f, q), (fv, qv), (fe, qe)))
    y = torch.from_numpy(y)
    net = AcceptanceNet(f.shape[1], cfg.hidden, cfg.n_blocks)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=0.1)
    # Weighted BCE (eq. 10): each side weighted by the other's share, so rejections (rarer
    # for a good drafter) pull as hard as acceptances. The weights multiply the odds the net
    # learns by w_acc / w_rej; subtracting its log from the output bias afterwards gives
    # calibrated probabilities again, which the early-exit rule needs.
    share = float(y.mean())
    w_acc, w_rej = 0.5 / max(share, 1e-3), 0.5 / max(1 - share, 1e-3)
    shift = math.log(w_acc / w_rej)

    def predict(inputs: torch.Tensor) -> np.ndarray:
        net.eval()
        with torch.no_grad():
            return torch.sigmoid(net(inputs) - shift).numpy()

    best, t0 = (float("inf"), None), time.perf_counter()
    with progress_bar("acceptance head", cfg.epochs, unit="epochs") as advance:
        for _ in range(cfg.epochs):
            net.train()
            for idx in torch.randperm(len(y)).split(256):
                p = torch.sigmoid(net(x[idx])).clamp(1e-6, 1 - 1e-6)
                loss = -(w_acc * y[idx] * p.log() + w_rej * (1 - y[idx]) * (1 - p).log()).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            # Early stopping on the validation sequences' Brier score.
            brier = float(((predict(xv) - yv) ** 2).mean())
            if brier < best[0]:
                best = (brier, {k: v.detach().clone() for k, v in net.state_dict().items()})
            advance(1)
    net.load_state_dict(best[1])
    pe = predict(xe)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    state["out.bias"] -= shift
    meta = json.loads((cfg.out / "meta.json").read_text())
    # Against the draft's own probability of the token as the estimate (what drafting without
    # a head uses, before its running calibration).
    report = {**calibration(pe, ye), **{f"draft_q_{k}": v for k, v in calibration(qe, ye).items()
                                        if k in ("ece", "brier")}}
    ckpt = {"kind": "acceptance-head", "label": cfg.label, "hidden": cfg.hidden,
            "n_blocks": cfg.n_blocks, "d_model": f.shape[1], "meta": meta, "report": report, "state": state}
    path = cfg.out / f"head-{cfg.label}.pt"
    torch.save(ckpt, path)
    reliability_diagram(pe, qe, ye, cfg.out / f"reliability-{cfg.label}.png",
                        f"{meta['drafter_file']} → {meta['target_file']} ({cfg.label})")
    print(f"{cfg.label}: {len(y)} training rows (accepted {share:.1%}), {len(yv)} for early stopping, "
          f"{time.perf_counter() - t0:.0f} s\nheld out: {report}")
    return path


def calibration(p: np.ndarray, y: np.ndarray, n_bins: int = 10) -> dict:
    """Rows, share accepted, expected calibration error (10 bins) and Brier score."""
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    ece = sum(abs(p[bins == b].mean() - y[bins == b].mean()) * (bins == b).mean()
              for b in range(n_bins) if (bins == b).any())
    return {"rows": int(len(y)), "accepted": round(float(y.mean()), 4), "ece": round(float(ece), 4),
            "brier": round(float(((p - y) ** 2).mean()), 4)}


def reliability_diagram(p: np.ndarray, q: np.ndarray, y: np.ndarray, path: Path, title: str,
                        n_bins: int = 10) -> None:
    """Held-out acceptance against the head's prediction p, and against the draft's own
    probability q of the token; below, how many rows each bin of p holds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, hx) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=[3, 1], sharex=True)
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect")
    for pred, name in ((p, "head"), (q, "draft q(x)")):
        bins = np.minimum((pred * n_bins).astype(int), n_bins - 1)
        used = [b for b in range(n_bins) if (bins == b).any()]
        ax.plot([pred[bins == b].mean() for b in used], [y[bins == b].mean() for b in used],
                marker="o", label=f"{name} (ECE {calibration(pred, y)['ece']:.3f})")
    ax.set_ylabel("accepted (held-out mean)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    centers = [(b + 0.5) / n_bins for b in range(n_bins)]
    count = [(bins == b).sum() for b in range(n_bins)]
    hx.bar(centers, count, width=1 / n_bins * 0.9)
    hx.set_xlabel("predicted acceptance")
    hx.set_ylabel("rows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    if math.isnan(float(np.mean(p))):
        raise LocalspecError("the head predicts NaN: training diverged")
