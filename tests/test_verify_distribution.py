"""The stochastic verifier emits exactly the target's distribution, for every rule and tree
shape: chains, wide trees, duplicate siblings, top-k/top-p processed targets, q with zeros."""

import numpy as np
import pytest
from scipy import stats

from localspec import _native
from localspec.sampling import SamplingConfig

pytestmark = pytest.mark.unit  # no model on disk

V = 12
N_TRIALS = 400_000
EMPTY_I, EMPTY_F = np.zeros(0, np.int32), np.zeros(0, np.float32)


def target_dist(cfg: SamplingConfig, row: np.ndarray) -> np.ndarray:
    ids, probs = _native.Sampler(cfg.native()).distribution(row.copy(), EMPTY_I)
    p = np.zeros(V)
    p[ids] = probs
    return p


def chi2_pvalue(samples: np.ndarray, p: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=V)
    assert counts[p == 0].sum() == 0, "emitted a token the target gives probability 0"
    keep = p > 0
    if keep.sum() == 1:
        return 1.0  # one possible token, and nothing else was emitted
    exp = p[keep] * len(samples)
    return stats.chisquare(counts[keep], exp * counts[keep].sum() / exp.sum()).pvalue


def run(target, tokens, parents, cfg, q=None, seed=0):
    """`target` = (root row, markov rows): after token x the target's logits are markov[x]."""
    tokens, parents = np.asarray(tokens, np.int32), np.asarray(parents, np.int32)
    if q is None:
        q_off, q_ids, q_p = EMPTY_I, EMPTY_I, EMPTY_F
    else:  # one dense draft distribution per node; its token is redrawn from it every trial
        q_off = np.arange(len(tokens) + 1, dtype=np.int32) * V
        q_ids = np.tile(np.arange(V, dtype=np.int32), len(tokens))
        q_p = np.concatenate(q).astype(np.float32)
    root, markov = target
    sampler = _native.Sampler(cfg.native())
    out = _native.verify_trials(root, markov, tokens, parents, q_off, q_ids, q_p, sampler, seed,
                                N_TRIALS)
    return out.reshape(-1, 2)


def check(target, tokens, parents, cfg, q=None):
    """First emitted token ~ p(root); the second, after an accepted x, ~ p(markov[x])."""
    out = run(target, tokens, parents, cfg, q)
    root, markov = target
    assert chi2_pvalue(out[:, 0], target_dist(cfg, root)) > 1e-4
    n_checked = 0
    for x in range(V):
        second = out[(out[:, 0] == x) & (out[:, 1] >= 0), 1]
        if len(second) > 3000:
            assert chi2_pvalue(second, target_dist(cfg, markov[x])) > 1e-4, f"after {x}"
            n_checked += 1
    assert n_checked > 0


def random_target(seed, scale=2.0):
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal(V) * scale).astype(np.float32),
            (rng.standard_normal((V, V)) * scale).astype(np.float32))


def dirichlet(seed, zeros=()):
    q = np.random.default_rng(seed).dirichlet(np.ones(V))
    q[list(zeros)] = 0
    return q / q.sum()


PLAIN = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
PROCESSED = SamplingConfig(temperature=0.8, top_k=6, top_p=0.9, min_p=0.02)

# Trees by rank: label k is the k-th most likely token after the parent, so that the
# deterministic drafts are the likely ones a real drafter would pick.
TREES = {
    "chain": ([0, 0, 0], [-1, 0, 1]),
    "wide": ([0, 1, 2, 3, 4], [-1, -1, -1, -1, -1]),
    "duplicate siblings": ([1, 1, 0], [-1, -1, -1]),
    "two levels": ([0, 1, 0, 1, 0], [-1, -1, 0, 0, 1]),
}


def realise(ranks, parents, target):
    root, markov = target
    tokens = []
    for k, par in zip(ranks, parents):
        row = root if par < 0 else markov[tokens[par]]
        tokens.append(int(np.argsort(-row, kind="stable")[k]))
    return tokens


@pytest.mark.parametrize("cfg", [PLAIN, PROCESSED], ids=["plain", "top-k/top-p"])
@pytest.mark.parametrize("shape", TREES)
def test_deterministic_drafts(shape, cfg):
    ranks, parents = TREES[shape]
    target = random_target(len(shape))
    check(target, realise(ranks, parents, target), parents, cfg)


@pytest.mark.parametrize("cfg", [PLAIN, PROCESSED], ids=["plain", "top-k/top-p"])
@pytest.mark.parametrize("shape", TREES)
def test_sampled_drafts(shape, cfg):
    tokens, parents = TREES[shape]
    # Each node's token is drawn from its q, which has zeros (tokens it never drafts).
    q = [dirichlet(100 + i, zeros=(0, 11, 10 - i)) for i in range(len(tokens))]
    check(random_target(7 + len(shape)), tokens, parents, cfg, q)


def test_sampled_siblings_sharing_one_q():
    """SpecInfer's case: several children drawn i.i.d. from the same q, duplicates included."""
    q0 = dirichlet(5)
    tokens, parents = [4, 4, 8, 1], [-1, -1, -1, -1]
    check(random_target(3), tokens, parents, PLAIN, [q0, q0, q0, q0])


def test_greedy_follows_argmax():
    root, markov = random_target(11)
    greedy = SamplingConfig(temperature=0)
    best = int(np.argmax(root))
    tokens, parents = [(best + 1) % V, best, int(np.argmax(markov[best]))], [-1, -1, 1]
    out = run((root, markov), tokens, parents, greedy)
    assert (out[:, 0] == best).all()
    assert (out[:, 1] == np.argmax(markov[best])).all()


def test_verifier_test_detects_a_biased_rule():
    """The check above would fail a verifier that always accepts a draft."""
    p = target_dist(PLAIN, random_target(1)[0])
    draft = int(np.argmin(p))
    biased = np.where(np.random.default_rng(0).random(N_TRIALS) < 0.5, draft,
                      np.random.default_rng(1).choice(V, N_TRIALS, p=p))
    assert chi2_pvalue(biased, p) < 1e-4
