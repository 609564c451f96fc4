"""`localspec train jakiro`: extract the target's features through llama.cpp and train the
drafter on them in one streaming pass (each shard is trained on as soon as it is extracted),
then further epochs over the cache. Resumable: the feature store and the checkpoint both
record how far they got, and are replaced atomically."""

from __future__ import annotations

import collections
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from localspec.convert import read_checkpoint
from localspec.drafters.jakiro_config import JakiroConfig
from localspec.llama.model import Model
from localspec.errors import LocalspecError
from localspec.paths import replacing, write_whole
from localspec.progress import progress_bar
from localspec.train.corpus import training_examples
from localspec.train.features import FeatureStore, Shard
from localspec.train.jakiro_net import JakiroNet, init_weights
from localspec.train.target_weights import TargetWeights


@dataclass(frozen=True)
class TrainConfig:
    target: Path
    out: Path                   # checkpoint folder
    max_tokens: int = 200_000   # corpus tokens to extract features for
    seq_len: int = 1024
    epochs: int = 2             # passes over the cached features (the first is streamed)
    lr: float = 9e-5
    draft_vocab: int = 32_000   # 0: the full target vocabulary
    n_experts: int = 2
    gamma: int = 6
    code_share: float = 0.5
    noise: float = 0.2          # uniform noise on input features, EAGLE's augmentation
    seed: int = 0
    n_threads: int = 0
    feature_dir: Path | None = None  # default: OUT/features


LOSS_WEIGHTS = (1.0, 1.0, 0.1, 0.05)  # SmoothL1 moe, SmoothL1 ctr, CE moe, CE ctr (paper eq. 16)
LOG_EVERY = 20  # training steps (sequences) per point of the loss curve
PLOT_EVERY = 60.0  # seconds between redrawings of loss.png (a drawing takes most of a second)


def draft_vocabulary(model: Model, cfg: TrainConfig, store: FeatureStore) -> list[int]:
    """The most frequent target tokens of the training corpus (learnt positions only), plus the
    end-of-generation tokens, as a sorted row subset of the head (EAGLE-3's d2t map). Counted
    from the feature cache when it already holds the corpus: rendering it again takes minutes."""
    if cfg.draft_vocab <= 0 or cfg.draft_vocab >= model.n_vocab:
        return []
    if store.n_tokens >= cfg.max_tokens:
        examples = (shard.example(i)[:2] for shard in store.shards() for i in range(len(shard)))
    else:
        examples = ((ex.tokens, ex.mask) for ex in training_examples(model, cfg.seq_len,
                                                                     cfg.code_share))
    counts: collections.Counter[int] = collections.Counter()
    seen = 0
    for tokens, mask in examples:
        counts.update(np.asarray(tokens)[np.asarray(mask)].tolist())
        seen += len(tokens)
        if seen >= cfg.max_tokens:
            break
    eog = [t for t in (model.special.eos, model.special.eot) if t >= 0]
    keep = set(eog) | {t for t, _ in counts.most_common(cfg.draft_vocab - len(eog))}
    return sorted(keep)


def sequence_loss(net: JakiroNet, tokens: np.ndarray, mask: np.ndarray, hidden: np.ndarray,
                  noise: float, gen: torch.Generator | None) -> tuple[torch.Tensor, dict]:
    """Paper eq. 12-16 on one sequence. Position t reads the target feature at t and the token
    at t + 1; f_moe is scored against the feature at t + 1 and its distribution (that of the
    token at t + 2), f_ctr against those at t + 2 (token t + 3). A position counts when the
    token its prediction is for is learnt (mask)."""
    T = len(tokens)
    H = torch.from_numpy(np.asarray(hidden, np.float32))
    feats = H[:T - 1]
    if noise > 0 and gen is not None:
        feats = feats + (torch.rand(feats.shape, generator=gen) - 0.5) * noise
    f_moe, f_ctr = net(feats, torch.from_numpy(np.asarray(tokens[1:], np.int64)))
    m = torch.from_numpy(np.array(mask, bool))
    m1 = torch.zeros(T - 1, dtype=torch.bool)
    m1[:T - 2] = m[2:]
    m2 = torch.zeros(T - 1, dtype=torch.bool)
    m2[:T - 3] = m[3:]
    if not m1.any():
        return torch.zeros(()), {}

    def terms(pred, target_feat, sel):
        reg = F.smooth_l1_loss(pred[sel], target_feat, reduction="none").mean(-1).mean()
        with torch.no_grad():
            p = torch.softmax(net.logits(target_feat), -1)
        logq = torch.log_softmax(net.logits(pred[sel]), -1)
        ce = -(p * logq).sum(-1).mean()
        acc = (logq.argmax(-1) == p.argmax(-1)).float().mean()
        return reg, ce, acc

    reg1, ce1, acc1 = terms(f_moe, H[1:][m1], m1)
    loss = LOSS_WEIGHTS[0] * reg1 + LOSS_WEIGHTS[2] * ce1
    stats = {"reg_moe": reg1.item(), "ce_moe": ce1.item(), "acc_moe": acc1.item()}
    if m2.any() and not net.cfg.single:  # the single-expert baseline has no f_ctr
        reg2, ce2, acc2 = terms(f_ctr, H[2:][m2[:T - 2]], m2)
        loss = loss + LOSS_WEIGHTS[1] * reg2 + LOSS_WEIGHTS[3] * ce2
        stats |= {"reg_ctr": reg2.item(), "ce_ctr": ce2.item(), "acc_ctr": acc2.item()}
    stats["loss"] = loss.item()
    return loss, stats


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        cfg.out.mkdir(parents=True, exist_ok=True)
        if cfg.n_threads:
            torch.set_num_threads(cfg.n_threads)
        self.model = Model(cfg.target)
        self.weights = TargetWeights(cfg.target)
        self.store = FeatureStore(cfg.feature_dir or cfg.out / "features", self.model)
        self.ckpt_path = cfg.out / "checkpoint.pt"
        self._plotted = -PLOT_EVERY  # when loss.png was last drawn (time.monotonic)
        if self.ckpt_path.exists():
            ckpt = read_checkpoint(self.ckpt_path)
            self.jcfg = JakiroConfig.from_dict(ckpt["config"])
            if self.jcfg.target_tokenizer != self.model.tokenizer_hash:
                raise LocalspecError(f"{self.ckpt_path} was trained for another target "
                                     f"({self.jcfg.target_name})")
            self.progress = ckpt["progress"]
        else:
            ckpt = None
            self.jcfg = self._new_config()
            self.progress = {"step": 0, "shards_done": 0, "epoch": 0, "history": []}
        rows = np.asarray(self.jcfg.draft_vocab, np.int64) if self.jcfg.draft_vocab else None
        self.net = JakiroNet(self.jcfg, self.weights.embedding(), self.weights.head(rows))
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
        if ckpt is not None:
            self.net.load_state_dict(ckpt["state"], strict=False)
            self.opt.load_state_dict(ckpt["optimizer"])
        else:
            init_weights(self.net, cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed + self.progress["step"])

    def _new_config(self) -> JakiroConfig:
        w = self.weights
        return JakiroConfig(
            target_name=self.model.name, target_vocab=self.model.n_vocab,
            target_tokenizer=self.model.tokenizer_hash, d_model=self.model.n_embd,
            n_heads=int(w.arch_meta("attention.head_count")),
            rope_theta=float(w.arch_meta("rope.freq_base", 10000.0)),
            norm_eps=float(w.arch_meta("attention.layer_norm_rms_epsilon", 1e-6)),
            n_experts=self.cfg.n_experts, top_k=min(2, self.cfg.n_experts), gamma=self.cfg.gamma,
            draft_vocab=draft_vocabulary(self.model, self.cfg, self.store))

    def train_shard(self, shard: Shard, label: str) -> None:
        order = np.random.default_rng(self.cfg.seed + self.progress["step"]).permutation(len(shard))
        window = []
        with progress_bar(label, len(order), unit="sequences") as advance:
            for i in order:
                tokens, mask, hidden = shard.example(int(i))
                loss, stats = sequence_loss(self.net, tokens, mask, hidden, self.cfg.noise, self.gen)
                advance(1)
                if not stats:
                    continue
                self.opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_value_(self.net.parameters(), 0.5)
                self.opt.step()
                self.progress["step"] += 1
                window.append(stats)
                if len(window) == LOG_EVERY:
                    self._log(window)
                    window = []
        if window:
            self._log(window)

    def _log(self, window: list[dict]) -> None:
        mean = {k: float(np.mean([s[k] for s in window if k in s])) for k in window[0]}
        self.progress["history"].append({"step": self.progress["step"], **mean})

    def save(self, last: bool = False) -> None:
        """The checkpoint and history.json; loss.png at most every PLOT_EVERY seconds, and
        for the `last` save."""
        ckpt = {"config": self.jcfg.to_dict(), "state": self.net.state_dict(),
                "optimizer": self.opt.state_dict(), "progress": self.progress,
                "train_config": {k: str(v) for k, v in asdict(self.cfg).items()}}
        with replacing(self.ckpt_path) as tmp:
            torch.save(ckpt, tmp)
        write_whole(self.cfg.out / "history.json", json.dumps(self.progress["history"], indent=1).encode())
        if last or time.monotonic() - self._plotted >= PLOT_EVERY:
            plot_losses(self.progress["history"], self.cfg.out / "loss.png")
            self._plotted = time.monotonic()

    def run(self) -> Path:
        cfg, p = self.cfg, self.progress
        while p["epoch"] < max(1, cfg.epochs):
            epoch = f"epoch {p['epoch'] + 1}"
            # Cached shards this epoch has not trained on yet...
            for s in self.store.manifest["shards"][p["shards_done"]:]:
                self._train_and_save(self.store.load(s["name"]), f"{epoch}: {s['name']}")
            # ...and in the first epoch, new shards as soon as they are extracted.
            if p["epoch"] == 0:
                examples = training_examples(self.model, cfg.seq_len, cfg.code_share)
                for shard in self.store.extract(examples, cfg.max_tokens, n_threads=cfg.n_threads):
                    self._train_and_save(shard, f"{epoch}: shard {p['shards_done']}")
            p["epoch"], p["shards_done"] = p["epoch"] + 1, 0
            self.save(last=p["epoch"] >= cfg.epochs)
        return self.ckpt_path

    def _train_and_save(self, shard: Shard, label: str) -> None:
        self.train_shard(shard, label)
        self.progress["shards_done"] += 1
        self.save()


def plot_losses(history: list[dict], path: Path) -> None:
    if not history:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [h["step"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key in ("reg_moe", "reg_ctr"):
        a.plot(steps, [h.get(key, np.nan) for h in history], label=key)
    for key in ("acc_moe", "acc_ctr"):
        b.plot(steps, [h.get(key, np.nan) for h in history], label=key)
    a.set_title("SmoothL1 to the target's features")
    b.set_title("top-1 agreement with the target")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def train_jakiro(cfg: TrainConfig) -> Path:
    t0 = time.perf_counter()
    path = Trainer(cfg).run()
    print(f"checkpoint: {path} ({time.perf_counter() - t0:.0f} s)")
    return path
