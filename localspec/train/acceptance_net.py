"""The acceptance head as a torch module (training only; inference is native, see
control/acceptance.py): the draft's hidden state and its probability of the token, a linear
map to `hidden`, residual SiLU blocks, one logit added to the draft's own log-odds."""

from __future__ import annotations

import torch
from torch import nn


def head_inputs(f: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The hidden state with q(x) and log q(x) appended: the draft's own confidence in the
    token is the strongest single signal, and a small head cannot easily recompute it from f."""
    q = q.clamp_min(1e-6).unsqueeze(-1)
    return torch.cat([f, q, q.log()], dim=-1)


class AcceptanceNet(nn.Module):
    def __init__(self, d_model: int, hidden: int = 128, n_blocks: int = 1, dropout: float = 0.8):
        super().__init__()
        # Dropout on the hidden state only: with the few thousand sequences a CPU can label,
        # an 896-wide input otherwise memorises them (train Brier 0.04, held out 0.17).
        self.drop = nn.Dropout(dropout)
        self.inp = nn.Linear(d_model + 2, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
                                    for _ in range(n_blocks))
        self.out = nn.Linear(hidden, 1)
        # The head starts as the draft's own probability (scaled log-odds, output zero) and
        # learns corrections to it, so it has to earn every departure from that baseline.
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.q_scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Acceptance logits (apply a sigmoid for probabilities); x from head_inputs."""
        z = self.inp(torch.cat([self.drop(x[..., :-2]), x[..., -2:]], dim=-1))
        for block in self.blocks:
            z = z + block(z)
        q = x[..., -2].clamp(1e-6, 1 - 1e-6)
        return self.out(nn.functional.silu(z)).squeeze(-1) + self.q_scale * torch.log(q / (1 - q))
