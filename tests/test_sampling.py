"""The native sampling transform against an independent numpy reference, and its draws
against the distribution it states."""

import numpy as np
import pytest
from scipy import stats

from localspec import _native
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig, TokenSampler

pytestmark = pytest.mark.unit  # no model on disk


def reference(logits, cfg: SamplingConfig, history=()):
    """llama.cpp's default chain, written plainly: penalties, top-k, top-p, min-p, temperature."""
    l = logits.astype(np.float64).copy()
    if cfg.repeat_penalty != 1.0:
        for t in set(list(history)[-cfg.repeat_last_n:]):
            l[t] = l[t] / cfg.repeat_penalty if l[t] > 0 else l[t] * cfg.repeat_penalty
    order = np.lexsort((np.arange(len(l)), -l))  # logit desc, id asc
    if cfg.temperature <= 0:
        return order[:1], np.array([1.0])
    k = len(l) if cfg.top_k <= 0 else min(cfg.top_k, len(l))
    keep = order[:k]
    p = np.exp(l[keep] - l[keep].max())
    p /= p.sum()
    n = k
    if cfg.top_p < 1:
        n = int(np.argmax(np.cumsum(p) >= cfg.top_p)) + 1 if np.cumsum(p)[-1] >= cfg.top_p else k
    if cfg.min_p > 0:
        n = max(1, int(np.sum(p[:n] >= cfg.min_p * p[0])))
    keep = keep[:n]
    q = np.exp((l[keep] - l[keep].max()) / cfg.temperature)
    return keep, q / q.sum()


CONFIGS = [
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingConfig(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
    SamplingConfig(temperature=1.3, top_k=10, top_p=1.0, min_p=0.0),
    SamplingConfig(temperature=0.5, top_k=0, top_p=0.8, min_p=0.0),
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1),
    SamplingConfig(temperature=0.8, top_k=0, top_p=0.9, min_p=0.05),
    SamplingConfig(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02, repeat_penalty=1.3),
]


def synthetic_logits(seed, n_vocab=500):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n_vocab) * 3).astype(np.float32)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_distribution_matches_reference(cfg):
    history = [3, 7, 7, 11, 42, 499]
    for seed in range(5):
        logits = synthetic_logits(seed)
        before = logits.copy()
        ids, probs = TokenSampler(cfg, history).distribution(logits)
        ref_ids, ref_p = reference(logits, cfg, history)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(probs, ref_p, rtol=1e-5, atol=1e-7)
        assert abs(probs.sum() - 1) < 1e-5
        np.testing.assert_array_equal(logits, before)  # the row is read in place, left intact


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[2], CONFIGS[5]])
def test_draws_follow_the_stated_distribution(cfg):
    logits = synthetic_logits(123, n_vocab=200)
    history = [5, 6, 7]
    s = TokenSampler(SamplingConfig(**{**cfg.__dict__, "seed": 7}), history)
    ids, probs = s.distribution(logits)
    n = 200_000
    draws = np.array([s.sample(logits) for _ in range(n)])
    counts = np.array([(draws == i).sum() for i in ids])
    assert counts.sum() == n, "drew a token outside the stated support"
    # Pool rare cells so every expected count is large enough for chi-square.
    expected = probs.astype(np.float64) * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()  # float32 probabilities sum to 1 only within rounding
    p_value = stats.chisquare(obs, exp).pvalue
    assert p_value > 1e-3, p_value


def test_chi_square_catches_a_one_percent_bias():
    """The statistical test above is strong enough: a 1% shift of mass is rejected."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.2])
    biased = p + np.array([0.01, -0.01, 0.0])
    counts = np.bincount(rng.choice(3, size=200_000, p=biased), minlength=3)
    assert stats.chisquare(counts, p * 200_000).pvalue < 1e-3


def test_seed_reproducible():
    logits = synthetic_logits(9)
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    a = [TokenSampler(cfg).sample(logits) for _ in range(1)]
    s1, s2 = TokenSampler(cfg), TokenSampler(cfg)
    seq1 = [s1.sample(logits) for _ in range(200)]
    seq2 = [s2.sample(logits) for _ in range(200)]
    assert seq1 == seq2 and seq1[0] == a[0]
    s3 = TokenSampler(SamplingConfig(**{**cfg.__dict__, "seed": 1235}))
    assert [s3.sample(logits) for _ in range(200)] != seq1


def test_greedy_breaks_ties_by_lowest_id_and_applies_penalty():
    logits = np.zeros(10, np.float32)
    logits[[3, 6]] = 5.0
    greedy = TokenSampler(SamplingConfig(temperature=0))
    assert greedy.sample(logits) == 3
    penalised = TokenSampler(SamplingConfig(temperature=0, repeat_penalty=2.0), history=[3])
    assert penalised.sample(logits) == 6
    assert logits[3] == 5.0


def test_history_outside_vocab_is_rejected():
    s = _native.Sampler(_native.SamplingParams())
    with pytest.raises(ValueError):
        s.distribution(np.zeros(4, np.float32), np.array([9], np.int32))


def test_settings_that_break_the_arithmetic_are_refused_and_bad_logits_still_give_a_token():
    with pytest.raises(LocalspecError, match="repeat penalty"):
        SamplingConfig(repeat_penalty=0.0)
    with pytest.raises(LocalspecError, match="temperature"):
        SamplingConfig(temperature=-1.0)
    for seed in (-5, 2**64):  # the native random stream takes 64 bits (-5 was a TypeError's trace)
        with pytest.raises(LocalspecError, match="seed must be 0 to 2"):
            SamplingConfig(temperature=0.8, seed=seed)
    TokenSampler(SamplingConfig(temperature=0.8, seed=2**64 - 1))
    # A model that emits NaN or infinity must not crash the sampler (it once read past an
    # empty candidate list): it gives some token in the vocabulary.
    s = TokenSampler(SamplingConfig(temperature=0.8, top_k=0, seed=1))
    for bad in (np.nan, np.inf):
        logits = np.full(50, bad, np.float32)
        assert 0 <= s.sample(logits) < 50
        ids, probs = s.distribution(logits)
        assert len(ids) >= 1 and np.isclose(probs.sum(), 1.0)
