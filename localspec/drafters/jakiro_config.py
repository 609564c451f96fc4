"""The Jakiro drafter's hyper-parameters and the facts about its target it must match. Shared
by training (torch), conversion (GGUF metadata) and the native runtime; needs no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class JakiroConfig:
    # The target it was made for: loading it beside another target is refused.
    target_name: str
    target_vocab: int
    target_tokenizer: str    # Model.tokenizer_hash of the target
    d_model: int             # the target's hidden size (features and embeddings)
    n_heads: int             # attention heads of the drafter's decoder layer
    rope_theta: float
    norm_eps: float = 1e-6
    n_experts: int = 2       # N (1: the EAGLE-style single-expert baseline of the ablation)
    top_k: int = 2           # K: the two activated experts make the two branches (1 when N = 1)
    d_expert: int = 0        # expert width; 0: d_model / 4 (the paper's), d_model / 2 when N = 1
    gamma: int = 6           # draft steps per round (the last two by CEPD in one forward)
    beta1: float = 1.2       # contrastive weights of the top-1 and top-2 experts
    beta2: float = 0.3
    # Draft vocabulary: target token ids of the head rows the drafter scores (empty: all).
    draft_vocab: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.d_expert == 0:  # a single expert as wide as the two activated ones together
            object.__setattr__(self, "d_expert", self.d_model // (2 if self.single else 4))
        if not (self.top_k == 2 and self.n_experts >= 2 or self.top_k == 1 and self.single):
            raise ValueError("Jakiro activates two experts (K = 2) of N >= 2; N = K = 1 is the "
                             "single-expert baseline")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")

    @property
    def single(self) -> bool:
        """EAGLE-style: one MLP, one branch per node, no CEPD (its contrast needs two experts)."""
        return self.n_experts == 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_draft_vocab(self) -> int:
        return len(self.draft_vocab) or self.target_vocab

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> JakiroConfig:
        return JakiroConfig(**d)
