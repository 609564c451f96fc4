"""The Jakiro drafter in torch: the training model and the reference the native runtime is
tested against.

One step, from the target's feature f (LM-head input) at position t and the embedding of the
token at t + 1:
    h = fc([embed(x); f])                       reduction FC, as EAGLE
    u = h + Attn(h)                             one decoder layer's attention, residual
    s = softmax(g · norm(u)); top-2 experts a, b with weights s_a, s_b renormalised to sum 1
    e_j = Expert_j(norm(u))                     SwiGLU MLPs of width d_expert = d_model / 4
    left  = u + e_a,  right = u + e_b           the two decoupled branches (each its own logits)
    f_moe = u + s_a e_a + s_b e_b               the next feature (predicts f at t + 1)
    f_ctr = u + beta1 e_a - beta2 e_b           CEPD's contrastive feature (predicts f at t + 2)
Differences from the paper's equations, adopted from its public code: the router and experts
read norm(u), and the residual u is added once to every feature (the paper's s_a f_a would
make each expert rebuild the whole feature); branch logits are W(u + e_j), unscaled by s_j."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from localspec.drafters.jakiro_config import JakiroConfig


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, NeoX layout (first half of each head rotates with the second), as
    ggml_rope_ext in GGML_ROPE_TYPE_NEOX mode computes it. x: (..., T, head_dim); pos: (T,)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = pos.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Expert(nn.Module):
    def __init__(self, d: int, d_expert: int):
        super().__init__()
        self.gate = nn.Linear(d, d_expert, bias=False)
        self.up = nn.Linear(d, d_expert, bias=False)
        self.down = nn.Linear(d_expert, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class JakiroNet(nn.Module):
    def __init__(self, cfg: JakiroConfig, embed: np.ndarray, head: np.ndarray):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.fc = nn.Linear(2 * d, d, bias=True)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.norm = RMSNorm(d, cfg.norm_eps)
        self.router = nn.Linear(d, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, cfg.d_expert) for _ in range(cfg.n_experts))
        # The target's frozen embedding and (draft-vocabulary rows of its) LM head.
        self.register_buffer("embed", torch.from_numpy(embed), persistent=False)
        self.register_buffer("head", torch.from_numpy(head), persistent=False)

    def attention(self, h, pos, mask=None, cache=None):
        """Causal self-attention (mask None) or attention under a boolean mask (T, n_cache + T),
        True = may attend. `cache` is a (k, v) pair of earlier positions, extended in place of
        the returned pair."""
        H, hd = self.cfg.n_heads, self.cfg.head_dim
        split = lambda x: x.view(*x.shape[:-1], H, hd).transpose(-3, -2)  # noqa: E731
        q = rope(split(self.q(h)), pos, self.cfg.rope_theta)
        k = rope(split(self.k(h)), pos, self.cfg.rope_theta)
        v = split(self.v(h))
        if cache is not None:
            k, v = torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and cache is None)
        out = out.transpose(-3, -2).reshape(*h.shape[:-1], self.cfg.d_model)
        return self.o(out), (k, v)

    def layer(self, feats, tokens, pos, mask=None, cache=None):
        """The decoder layer: u, every expert's output (..., N, d), the router logits and the
        new KV cache (what the native runtime returns too)."""
        h = self.fc(torch.cat([self.embed[tokens], feats], dim=-1))
        a, cache = self.attention(h, pos, mask, cache)
        u = h + a
        x = self.norm(u)
        experts = torch.stack([e(x) for e in self.experts], dim=-2)  # N is small: run them all
        return u, experts, self.router(x), cache

    def step(self, feats, tokens, pos, mask=None, cache=None):
        """The decoder layer over a batch of positions. Returns u, the top-2 expert outputs
        (e_a, e_b), their renormalised weights (s_a, s_b) and the new KV cache."""
        u, experts, router, cache = self.layer(feats, tokens, pos, mask, cache)
        e_a, e_b, s_a, s_b = top2(experts, router)
        return u, e_a, e_b, s_a, s_b, cache

    def features(self, u, e_a, e_b, s_a, s_b):
        f_moe = u + s_a * e_a + s_b * e_b
        f_ctr = u + self.cfg.beta1 * e_a - self.cfg.beta2 * e_b
        return f_moe, f_ctr

    def logits(self, f):
        return f @ self.head.T

    def forward(self, feats, tokens):
        """Teacher-forced training pass over one sequence: feats (T, d) are the target's
        features at positions 0..T-1, tokens (T,) the tokens at 1..T. Returns f_moe, f_ctr."""
        pos = torch.arange(feats.shape[-2])
        u, e_a, e_b, s_a, s_b, _ = self.step(feats, tokens, pos)
        return self.features(u, e_a, e_b, s_a, s_b)


def top2(experts: torch.Tensor, router: torch.Tensor):
    """The two activated experts' outputs and their weights renormalised to sum to 1 (a single
    expert: its output and weight 1, and a zero second expert of weight 0)."""
    if experts.shape[-2] == 1:
        e = experts[..., 0, :]
        one = torch.ones(*e.shape[:-1], 1)
        return e, torch.zeros_like(e), one, 0 * one
    scores = torch.softmax(router, dim=-1)
    top_s, top_i = scores.topk(2, dim=-1)
    top_s = top_s / top_s.sum(-1, keepdim=True)
    picked = experts.gather(-2, top_i[..., None].expand(*top_i.shape, experts.shape[-1]))
    return picked[..., 0, :], picked[..., 1, :], top_s[..., 0:1], top_s[..., 1:2]


def init_weights(net: JakiroNet, seed: int = 0) -> None:
    """Small random init; fc starts near passing the feature through, so an untrained drafter
    already predicts 'the same feature again' rather than noise."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]) * 0.5, generator=g)
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.zero_()
        d = net.cfg.d_model
        net.fc.weight[:, d:] += torch.eye(d)
