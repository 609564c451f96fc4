"""Tiny random-weight GGUF models of llama.cpp architectures, for tests.

    python tests/random_gguf.py ARCH SIZE OUT.gguf [--tokenizer FROM.gguf] [--seed S]

    from random_gguf import make          # tests/ is on sys.path under pytest
    make("qwen35", "tiny", tmp_path / "m.gguf", seed=0)   # tokenizer= another GGUF

ARCH: qwen3moe (Mixture of Experts), qwen35 (gated delta-net + attention), lfm2 (short
convolution + attention), granitehybrid (mamba2 + attention), nemotron_h (mamba2 + attention +
MLP layers), mamba2 (recurrent only); qwen35moe, lfm2moe, nemotron_h_moe (their MoE versions),
qwen3next (Qwen3.5's MoE forerunner), falcon-h1 (attention beside mamba2 in each layer), jamba
(mamba + attention, MoE), rwkv7 (recurrent only), kimi-linear (Kimi delta attention + MLA, MoE).
SIZE: tiny (embedding 128, 2-4 layers, ~50 MiB with a 49k vocabulary, made in ~0.6 s, loads in
~0.1 s), small (embedding 256, twice the layers), 1b (embedding 1024, 8-16 layers: timing; the
MoE ones up to 2.3 GiB), 7b-mtp (qwen35 alone: a 7B's embedding and FFN, the fewest layers: an
MTP layer's step at a 7B's shape). Tensor names, shapes and keys follow llama.cpp's loaders
(src/models/<arch>.cpp); dims are chosen to meet the CUDA kernels' limits too (SSM_CONV channels
% 128, mamba2 d_state 128, mamba d_state 16, delta-net head 32, RWKV-7 head 64; checked on CPU
only). The tokenizer (every `tokenizer.*` key) comes from another GGUF, the SmolLM2 test model by
default; token embedding and output have its vocabulary size. Weights are F32, drawn from
`seed`: the same seed gives the same file. Matrices ~N(0, 0.02), norms 1 (biases 0), the MoE
router ~N(0, 0.1) (tokens pick different experts); recurrent parameters use the models' own
initialisations, which keep the recurrence stable: A = -exp(A_log) in [-16, -1], dt bias =
softplus^-1(dt) with dt log-uniform in [1e-3, 0.1], D = 1, conv weights ~U(+-1/sqrt(kernel)),
conv bias 0.
"""
from __future__ import annotations

import argparse
import functools
import mmap
import os
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import platformdirs

from localspec.llama.gguf import read_header

# The SmolLM2 model the tests pull (conftest.py's folder).
DEFAULT_TOKENIZER = Path(os.environ.get("LOCALSPEC_TEST_MODELS") or platformdirs.user_cache_dir(
    "localspec-test-models")) / "smollm2-135m-instruct.gguf"
# embedding, repeats of the layer pattern; "1b": a small real model's width and depth (LFM2's
# and Qwen3.5's smallest have 1024 and 16-24 layers), for timing, not its exact layer mix
SIZES = {"tiny": (128, 1), "small": (256, 2), "1b": (1024, 4), "7b-mtp": (3584, 1)}
W, ONE, ZERO, ROUTER, CONV, A_NEG, DT, ECHO = "w", "one", "zero", "router", "conv", "a", "dt", "echo"


# Building blocks: (tensor name within blk.N., shape in ggml order (ne0, ne1, ...), init).
def norm(E, *names):
    return [(f"{name}.weight", (E,), ONE) for name in names]


def layernorm(E, *names):  # weight and bias
    return [t for name in names for t in [(f"{name}.weight", (E,), ONE), (f"{name}.bias", (E,), ZERO)]]


def attn(E, H, KV, D, q_mult=1, qk_norm=False):  # q_mult 2: Qwen3.5's query + gate
    t = [("attn_q.weight", (E, H * D * q_mult), W), ("attn_k.weight", (E, KV * D), W),
         ("attn_v.weight", (E, KV * D), W), ("attn_output.weight", (H * D, E), W)]
    return t + ([("attn_q_norm.weight", (D,), ONE), ("attn_k_norm.weight", (D,), ONE)] if qk_norm else [])


def ffn(E, F, gate=True, suffix=""):  # suffix "_shexp": a shared expert
    t = [(f"ffn_up{suffix}.weight", (E, F), W), (f"ffn_down{suffix}.weight", (F, E), W)]
    return t + ([(f"ffn_gate{suffix}.weight", (E, F), W)] if gate else [])


def moe(E, X, FX, gate=True, bias=False):  # bias: the router's (DeepSeek-V3 style)
    t = [("ffn_gate_inp.weight", (E, X), ROUTER)]
    t += [("ffn_gate_exps.weight", (E, FX, X), W)] if gate else []
    t += [("ffn_up_exps.weight", (E, FX, X), W), ("ffn_down_exps.weight", (FX, E, X), W)]
    return t + ([("exp_probs_b.bias", (X,), ZERO)] if bias else [])


def mamba2(E, I, N, H, G, K):  # inner size, state size, heads, groups, conv kernel
    C = I + 2 * G * N  # conv channels: x, B, C
    return [("ssm_in.weight", (E, I + C + H), W), ("ssm_conv1d.weight", (K, C), CONV),
            ("ssm_conv1d.bias", (C,), ZERO), ("ssm_dt.bias", (H,), DT), ("ssm_a", (1, H), A_NEG),
            ("ssm_d", (1, H), ONE), ("ssm_norm.weight", (I // G, G), ONE), ("ssm_out.weight", (I, E), W)]


def mamba1(E, I, N, R, K):  # inner size, state size, dt rank, conv kernel
    return [("ssm_in.weight", (E, 2 * I), W), ("ssm_conv1d.weight", (K, I), CONV),
            ("ssm_conv1d.bias", (I,), ZERO), ("ssm_x.weight", (I, R + 2 * N), W),
            ("ssm_dt.weight", (R, I), W), ("ssm_dt.bias", (I,), DT), ("ssm_a", (N, I), A_NEG),
            ("ssm_d", (I,), ONE), ("ssm_out.weight", (I, E), W)]


def gated_delta_net(E, N, HK, HV, K, fused_ba=False):  # head dim, key/value heads, conv kernel
    C = 2 * N * HK + N * HV
    ba = ([("ssm_ba.weight", (E, 2 * HV), W)] if fused_ba else  # Qwen3-Next's beta and alpha
          [("ssm_beta.weight", (E, HV), W), ("ssm_alpha.weight", (E, HV), W)])
    return [("attn_qkv.weight", (E, C), W), ("attn_gate.weight", (E, N * HV), W),
            ("ssm_conv1d.weight", (K, C), CONV), ("ssm_dt.bias", (HV,), DT), ("ssm_a", (HV,), A_NEG),
            *ba, ("ssm_norm.weight", (N,), ONE), ("ssm_out.weight", (N * HV, E), W)]


def shortconv(E, L):
    return [("shortconv.conv.weight", (L, E), CONV), ("shortconv.in_proj.weight", (E, 3 * E), W),
            ("shortconv.out_proj.weight", (E, E), W)]


def experts(X, FX, shared=0, **more):  # the MoE keys
    return {"expert_count": X, "expert_used_count": 2, "expert_feed_forward_length": FX,
            **({"expert_shared_feed_forward_length": shared} if shared else {}), **more}


# Per architecture: the `ARCH.*` keys, the layer pattern (one letter a layer) and each letter's
# tensors (R: recurrent, A: attention, F: feed-forward only, M: recurrent + MoE), and "head":
# the final norm where it is not output_norm.weight.
def qwen3moe(E, n):
    H, KV, D, X = E // 32, E // 64, 64, 8
    kv = {"feed_forward_length": 3 * E, "attention.head_count": H, "attention.head_count_kv": KV,
          "attention.key_length": D, "attention.value_length": D, "rope.freq_base": 1e6,
          "attention.layer_norm_rms_epsilon": 1e-6, **experts(X, E)}
    return kv, "AA" * n, {"A": norm(E, "attn_norm") + attn(E, H, KV, D, qk_norm=True)
                          + norm(E, "ffn_norm") + moe(E, X, E)}


def qwen35(E, n, X=0, next_=False, F=None):  # X experts (qwen35moe); next_: Qwen3-Next; F: FFN
    H, D, N, HK, HV, F = E // 64, 64, 32, E // 64, E // 32, F or 2 * E
    kv = {"feed_forward_length": F, "attention.head_count": H, "attention.head_count_kv": 1,
          "attention.key_length": D, "attention.value_length": D, "rope.freq_base": 1e7,
          "rope.dimension_count": 16, "rope.dimension_sections": [3, 3, 2, 0],
          "attention.layer_norm_rms_epsilon": 1e-6, "full_attention_interval": 2,
          "ssm.conv_kernel": 4, "ssm.state_size": N, "ssm.group_count": HK,
          "ssm.time_step_rank": HV, "ssm.inner_size": N * HV, **(experts(X, E, shared=E) if X else {})}
    if next_:  # plain (partial) RoPE
        del kv["rope.dimension_sections"]
    mlp = (moe(E, X, E) + ffn(E, E, suffix="_shexp") + [("ffn_gate_inp_shexp.weight", (E,), W)]
           if X else ffn(E, F))
    common = norm(E, "attn_norm", "post_attention_norm") + mlp
    return kv, "RA" * 2 * n, {"R": common + gated_delta_net(E, N, HK, HV, 4, fused_ba=next_),
                              "A": common + attn(E, H, 1, D, q_mult=2, qk_norm=True)}


def lfm2(E, n, X=0):  # X experts: lfm2moe
    H, pattern = E // 64, "RARA" * n
    kv = {"feed_forward_length": 2 * E, "attention.head_count": H,
          "attention.head_count_kv": [0 if c == "R" else H for c in pattern], "rope.freq_base": 1e6,
          "attention.layer_norm_rms_epsilon": 1e-5, "shortconv.l_cache": 3,
          **(experts(X, E, expert_gating_func=2) if X else {})}  # 2: sigmoid
    common = norm(E, "attn_norm", "ffn_norm") + (moe(E, X, E, bias=True) if X else ffn(E, 2 * E))
    return kv, pattern, {"R": common + shortconv(E, 3), "A": common + attn(E, H, H, 64, qk_norm=True),
                         "head": norm(E, "token_embd_norm")}  # LFM2's final norm's (odd) name


def granitehybrid(E, n):
    H, pattern, I, N, HS = E // 64, "RARA" * n, 2 * E, 128, 2 * E // 32
    kv = {"feed_forward_length": 2 * E, "attention.head_count": H,
          "attention.head_count_kv": [0 if c == "R" else 1 for c in pattern], "rope.freq_base": 1e4,
          "attention.layer_norm_rms_epsilon": 1e-5, "ssm.conv_kernel": 4, "ssm.inner_size": I,
          "ssm.state_size": N, "ssm.time_step_rank": HS, "ssm.group_count": 1}
    common = norm(E, "attn_norm", "ffn_norm") + ffn(E, 2 * E)
    return kv, pattern, {"R": common + mamba2(E, I, N, HS, 1, 4), "A": common + attn(E, H, 1, 64)}


def nemotron_h(E, n, X=0):  # Nemotron-H's "M*M-": mamba2, attention, mamba2, MLP (MoE: X experts)
    H, pattern, I, N, HS = E // 64, "RARF" * n, 2 * E, 128, 2 * E // 32
    kv = {"feed_forward_length": [2 * E if c == "F" else 0 for c in pattern],
          "attention.head_count": H, "attention.head_count_kv": [1 if c == "A" else 0 for c in pattern],
          "attention.key_length": 64, "attention.value_length": 64,
          "attention.layer_norm_epsilon": 1e-5, "attention.layer_norm_rms_epsilon": 1e-5,
          "ssm.conv_kernel": 4, "ssm.inner_size": I, "ssm.state_size": N, "ssm.time_step_rank": HS,
          "ssm.group_count": 1, **(experts(X, E, shared=E, expert_weights_norm=True,
                                           expert_weights_scale=2.5) if X else {})}
    mlp = (moe(E, X, E, gate=False, bias=True) + ffn(E, E, gate=False, suffix="_shexp")
           if X else ffn(E, 2 * E, gate=False))
    return kv, pattern, {"R": norm(E, "attn_norm") + mamba2(E, I, N, HS, 1, 4),
                         "A": norm(E, "attn_norm") + attn(E, H, 1, 64), "F": norm(E, "attn_norm") + mlp}


def mamba2_plain(E, n):
    I, N, HS = 2 * E, 128, 2 * E // 32
    kv = {"attention.layer_norm_rms_epsilon": 1e-5, "ssm.conv_kernel": 4, "ssm.inner_size": I,
          "ssm.state_size": N, "ssm.time_step_rank": HS, "ssm.group_count": 1}
    return kv, "RR" * n, {"R": norm(E, "attn_norm") + mamba2(E, I, N, HS, 1, 4)}


def falcon_h1(E, n):  # attention and mamba2 side by side in every layer
    H, I, N, HS = E // 64, 2 * E, 128, 2 * E // 32
    kv = {"feed_forward_length": 2 * E, "attention.head_count": H, "attention.head_count_kv": 1,
          "rope.freq_base": 1e11, "attention.layer_norm_rms_epsilon": 1e-5, "ssm.conv_kernel": 4,
          "ssm.inner_size": I, "ssm.state_size": N, "ssm.time_step_rank": HS, "ssm.group_count": 1}
    return kv, "RR" * n, {"R": norm(E, "attn_norm") + attn(E, H, 1, 64) + mamba2(E, I, N, HS, 1, 4)
                          + [("ffn_norm", (E,), ONE)] + ffn(E, 2 * E)}  # no .weight, as converted


def jamba(E, n):  # mamba (1) or attention layers, MoE every other layer
    H, pattern, I, N, R, X = E // 64, "RMAM" * n, 2 * E, 16, E // 16, 4
    kv = {"feed_forward_length": 2 * E, "attention.head_count": H,
          "attention.head_count_kv": [1 if c == "A" else 0 for c in pattern],
          "attention.layer_norm_rms_epsilon": 1e-6, "ssm.conv_kernel": 4, "ssm.inner_size": I,
          "ssm.state_size": N, "ssm.time_step_rank": R, "expert_count": X, "expert_used_count": 2}
    ssm = (norm(E, "attn_norm", "ffn_norm") + mamba1(E, I, N, R, 4) + norm(R, "ssm_dt_norm")
           + norm(N, "ssm_b_norm", "ssm_c_norm"))
    return kv, pattern, {"R": ssm + ffn(E, 2 * E), "M": ssm + moe(E, X, 2 * E),
                         "A": norm(E, "attn_norm", "ffn_norm") + attn(E, H, 1, 64) + ffn(E, 2 * E)}


def rwkv7(E, n):
    L = 16  # the LoRA ranks (decay, in-context learning rate, value residual mix; gate: 2 L)
    kv = {"feed_forward_length": 4 * E, "attention.layer_norm_epsilon": 1e-5, "wkv.head_size": 64,
          "attention.decay_lora_rank": L, "attention.iclr_lora_rank": L,
          "attention.value_residual_mix_lora_rank": L, "attention.gate_lora_rank": 2 * L}
    lora = [t for x in "wav" for t in [(f"time_mix_{x}1.weight", (E, L), W),
                                       (f"time_mix_{x}2.weight", (L, E), W)]]
    # the output gate ~N(0, 0.1) as the router: at 0.02 it (~0.06) all but mutes the time mix
    lora += [("time_mix_g1.weight", (E, 2 * L), W), ("time_mix_g2.weight", (2 * L, E), ROUTER)]
    mix = [(f"time_mix_{x}.weight", (E,), W) for x in ("w0", "a0", "v0", "k_k", "k_a", "r_k")]
    mix += [(f"time_mix_{x}.weight", (E, E), W) for x in ("key", "value", "receptance", "output")]
    mix += [("time_mix_lerp_fused.weight", (E, 1, 1, 6), W), ("channel_mix_lerp_k.weight", (E, 1, 1), W),
            ("channel_mix_key.weight", (E, 4 * E), W), ("channel_mix_value.weight", (4 * E, E), W)]
    return kv, "RR" * n, {"R": layernorm(E, "attn_norm", "attn_norm_2", "time_mix_ln") + lora + mix,
                          "head": layernorm(E, "token_embd_norm", "output_norm")}


def glm4moe(E, n):  # a dense first layer, then MoE ones with a shared expert (GLM-4.5)
    H, KV, D, X = E // 64, 1, 64, 8
    kv = {"feed_forward_length": 2 * E, "attention.head_count": H, "attention.head_count_kv": KV,
          "attention.key_length": D, "attention.value_length": D, "rope.dimension_count": D // 2,
          "rope.freq_base": 1e6, "attention.layer_norm_rms_epsilon": 1e-5,
          "leading_dense_block_count": 1, **experts(X, E, expert_shared_count=1)}
    common = norm(E, "attn_norm", "post_attention_norm") + attn(E, H, KV, D)
    return kv, "D" + "X" * (2 * n - 1), {"D": common + ffn(E, 2 * E),
                                         "X": common + moe(E, X, E, bias=True) + ffn(E, E, suffix="_shexp")}


def kimi_linear(E, n):  # Kimi delta attention (KDA), multi-head latent attention (MLA), MoE
    H, HD, X, R, P, KM, VM = E // 32, 32, 8, 64, 16, 48, 32  # MLA: KV LoRA rank, RoPE, K, V dims
    pattern = "RRRA" * n
    kv = {"attention.head_count": H, "attention.head_count_kv": [1 if c == "A" else 0 for c in pattern],
          "attention.key_length": R + P, "attention.value_length": R, "attention.key_length_mla": KM,
          "attention.value_length_mla": VM, "attention.kv_lora_rank": R, "rope.dimension_count": P,
          "attention.layer_norm_rms_epsilon": 1e-5, "kda.head_dim": HD, "ssm.conv_kernel": 4,
          **experts(X, E, expert_shared_count=1, expert_gating_func=2, expert_weights_scale=2.5)}
    kda = [(f"ssm_conv1d_{x}.weight", (4, 1, H * HD), CONV) for x in "qkv"] + [
        ("ssm_f_a.weight", (E, HD), W), ("ssm_f_b.weight", (HD, H * HD), W),
        ("ssm_dt.bias", (H * HD,), DT), ("ssm_a", (1, H), A_NEG), ("ssm_beta.weight", (E, H), W),
        ("ssm_g_a.weight", (E, HD), W), ("ssm_g_b.weight", (HD, H * HD), W),
        ("ssm_norm.weight", (HD,), ONE)]
    mla = [("attn_q.weight", (E, H * KM), W), ("attn_kv_a_mqa.weight", (E, R + P), W),
           ("attn_k_b.weight", (KM - P, R, H), W), ("attn_v_b.weight", (R, VM, H), W),
           ("attn_output.weight", (H * VM, E), W)] + norm(R, "attn_kv_a_norm")
    common = norm(E, "attn_norm", "ffn_norm") + moe(E, X, E, bias=True) + ffn(E, E, suffix="_shexp")
    return kv, pattern, {"R": common + attn(E, H, H, HD) + kda, "A": common + mla}


ARCHS = {"qwen3moe": qwen3moe, "qwen35": qwen35, "lfm2": lfm2, "granitehybrid": granitehybrid,
         "nemotron_h": nemotron_h, "mamba2": mamba2_plain,
         "qwen35moe": functools.partial(qwen35, X=8), "lfm2moe": functools.partial(lfm2, X=8),
         "nemotron_h_moe": functools.partial(nemotron_h, X=8),
         "qwen3next": functools.partial(qwen35, X=8, next_=True),
         "falcon-h1": falcon_h1, "jamba": jamba, "rwkv7": rwkv7, "kimi-linear": kimi_linear,
         "glm4moe": glm4moe}
# Architectures whose GGUF may carry MTP layers (--mtp): the layer kind the MTP block is.
MTP_BLOCK = {"glm4moe": "X", "qwen35": "A"}
# The MTP block's own tensors, beside a layer of its kind's (the target's output head is shared).
def nextn(E):
    return [("nextn.eh_proj.weight", (2 * E, E), W)] + norm(E, "nextn.enorm", "nextn.hnorm",
                                                             "nextn.shared_head_norm")


# What a block adds to the residual stream through (make's `quiet` scales them).
OUTPUTS = ("attn_output", "ffn_down", "ssm_out", "shortconv.out_proj")
QUIET = "quiet"


def init(rng, kind, shape):
    """Values for a tensor of ggml `shape` (numpy's is reversed)."""
    np_shape = tuple(reversed(shape))
    if isinstance(kind, tuple) and kind[0] == QUIET:  # W's values scaled
        return rng.normal(0, 0.02 * kind[1], np_shape)
    if kind == W:
        return rng.normal(0, 0.02, np_shape)
    if kind == ROUTER:
        return rng.normal(0, 0.1, np_shape)
    if kind == ONE:
        return np.ones(np_shape)
    if kind == ZERO:
        return np.zeros(np_shape)
    if kind == CONV:  # ne0 is the kernel width
        return rng.uniform(-1, 1, np_shape) / np.sqrt(shape[0])
    if kind == A_NEG:  # A = -exp(A_log), A_log = log U(1, 16)
        return -rng.uniform(1, 16, np_shape)
    if kind == ECHO:  # (n_out, k * n_out): the last n_out inputs pass through
        n_out, n_in = np_shape
        return np.hstack([np.zeros((n_out, n_in - n_out)), np.eye(n_out)])
    if kind == DT:  # softplus(bias) = dt, dt log-uniform in [1e-3, 1e-1]
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), np_shape))
        return dt + np.log(-np.expm1(-dt))
    raise ValueError(kind)


SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def tokenizer_keys(path: Path) -> list:
    """[(key, value, type, sub_type)] for the `tokenizer.*` keys of a GGUF."""
    return [k for k in all_keys(path) if k[0].startswith("tokenizer.")]


@functools.lru_cache(maxsize=4)
def all_keys(path: Path) -> list:
    """[(key, value, type, sub_type)] for every key of a GGUF (GGUFReader takes seconds on a
    49k-token vocabulary; this takes a tenth of one)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as b:
        assert b[:4] == b"GGUF", f"{path}: not a GGUF file"
        n_kv, pos = struct.unpack_from("<Q", b, 16)[0], 24

        def read(t):
            nonlocal pos
            if t == 8:  # string, kept as bytes
                n = struct.unpack_from("<Q", b, pos)[0]
                pos += 8 + n
                return b[pos - n:pos]
            if t == 9:  # array: element type, count, elements
                sub, n = struct.unpack_from("<IQ", b, pos)
                pos += 12
                if sub == 8:
                    return [read(8) for _ in range(n)]
                a = np.frombuffer(b, np.dtype("<" + SCALARS[sub]), n, pos)
                pos += a.nbytes
                return a.tolist()
            v = struct.unpack_from("<" + SCALARS[t], b, pos)[0]
            pos += struct.calcsize(SCALARS[t])
            return v

        keys = []
        for _ in range(n_kv):
            key, t = read(8).decode(), struct.unpack_from("<I", b, pos)[0]
            pos += 4
            sub = struct.unpack_from("<I", b, pos)[0] if t == 9 else None
            value = read(t)
            sub = None if sub is None else gguf.GGUFValueType(sub)
            keys.append((key, value, gguf.GGUFValueType(t), sub))
        return keys


def add_key(w: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, list):
        w.add_array(key, value)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    else:
        w.add_uint32(key, value)


def write(out: Path, arch: str, name: str, tokenizer: Path, kv: dict, plan: list, seed: int,
          extra: dict | None = None) -> Path:
    """A GGUF of `arch`: `tokenizer`'s `tokenizer.*` keys, `ARCH.key`s (and `extra` keys as
    they are), tensors drawn from seed."""
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name)
    for key, value, t, sub in tokenizer_keys(Path(tokenizer).resolve()):
        if key not in (extra or {}):
            w.add_key_value(key, value, t, sub_type=sub)
    for key, value in (extra or {}).items():
        add_key(w, key, value)
    for key, value in kv.items():
        add_key(w, f"{arch}.{key}", value)
    rng = np.random.default_rng(seed)
    made: dict[str, np.ndarray] = {}
    for tensor, shape, kind in plan:  # kind: how to draw it, its values, or a tensor made before
        if isinstance(kind, np.ndarray):
            made[tensor] = kind if kind.dtype == np.int64 else kind.astype(np.float32)
        else:
            made[tensor] = made[kind] if kind in made else init(rng, kind, shape).astype(np.float32)
        if made[tensor].dtype == np.int64:  # token ids (d2t)
            w.add_tensor(tensor, made[tensor], raw_dtype=gguf.GGMLQuantizationType.I64)
        else:
            w.add_tensor(tensor, made[tensor])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def vocab_size(tokenizer: Path) -> int:
    return next(len(value) for key, value, *_ in tokenizer_keys(Path(tokenizer).resolve())
                if key == "tokenizer.ggml.tokens")


def make(arch: str, size: str, out: Path, tokenizer: Path = DEFAULT_TOKENIZER, seed: int = 0,
         mtp: bool = False, echo: bool = False, repeats: bool = False, quiet: float = 1.0) -> Path:
    """Write a random-weight `arch` model of `size` to `out`, with `tokenizer`'s vocabulary;
    `mtp`: with an MTP layer after its last, which (`echo`) predicts the token the target
    predicted last again; `repeats`: its output head is its token embeddings, so it mostly
    repeats a token (what an echo drafter is accepted on)."""
    E, reps = SIZES[size]
    if size == "7b-mtp" and arch != "qwen35":
        raise SystemExit("7b-mtp: a qwen35")
    kv, pattern, blocks = ARCHS[arch](E, reps, **({"F": 18944} if size == "7b-mtp" else {}))  # a 7B's FFN
    if mtp and arch not in MTP_BLOCK:
        raise SystemExit(f"--mtp: one of {', '.join(MTP_BLOCK)}")
    vocab = vocab_size(tokenizer)
    kv = {"vocab_size": vocab, "context_length": 4096, "embedding_length": E,
          "block_count": len(pattern) + mtp, **kv, **({"nextn_predict_layers": 1} if mtp else {})}
    if quiet != 1.0:
        blocks = {k: [(n, shape, (QUIET, quiet) if n.startswith(OUTPUTS) and i == W else i) for n, shape, i in v]
                  for k, v in blocks.items()}
    plan = [("token_embd.weight", (E, vocab), W), *blocks.pop("head", norm(E, "output_norm")),
            ("output.weight", (E, vocab), "token_embd.weight" if repeats else W)]
    for i, kind in enumerate(pattern):
        plan += [(f"blk.{i}.{name}", shape, init_) for name, shape, init_ in blocks[kind]]
    if mtp:
        block = blocks[MTP_BLOCK[arch]] + nextn(E)
        plan += [(f"blk.{len(pattern)}.{name}", shape, echoed(name, init_) if echo else init_)
                 for name, shape, init_ in block]
    return write(out, arch, f"random {arch} {size}{' with MTP' if mtp else ''} (seed {seed})", tokenizer,
                 kv, plan, seed)


def echoed(name: str, kind: str) -> str:
    """An echo layer's init: its input projection passes the hidden state it is given through
    (to the target's own output head) and its attention and FFN add nothing."""
    if name.startswith(("nextn.eh_proj", "fc.")):
        return ECHO
    return ZERO if name.startswith(("attn_output", "ffn_down")) else kind


def target_keys(path: Path) -> dict:
    """The `ARCH.*` keys of a target GGUF, without their prefix, and its architecture."""
    keys = dict((k, v) for k, v, *_ in all_keys(Path(path).resolve()))
    arch = keys["general.architecture"].decode()
    return {"arch": arch, **{k[len(arch) + 1:]: v for k, v in keys.items() if k.startswith(arch + ".")}}


def make_drafter(kind: str, out: Path, target: Path, seed: int = 0, embd: int | None = None,
                 echo: bool = False, draft_vocab: int | None = None) -> Path:
    """An EAGLE-3 drafter for `target` (its tokenizer, its width, heads and feed-forward size;
    its token embeddings and output head are the target's, as in published EAGLE-3 GGUFs for
    Llama 3.1 8B): one decoder layer over the target's layer inputs [2, N/2, N-1]. `embd`:
    made for a target of another width; `echo`: it passes the deepest of those through to the
    target's head, predicting what the target would from there; `draft_vocab`: a head of its
    own over the target's first tokens (published ones keep 32k) and d2t, their ids."""
    t = target_keys(target)
    E, n_layer = t["embedding_length"], t["block_count"] - t.get("nextn_predict_layers", 0)
    hidden = embd or E
    H, FF = t["attention.head_count"], t["feed_forward_length"]
    KV, D = t.get("attention.head_count_kv", H), E // H
    kv = {"context_length": 4096, "embedding_length": E, "block_count": 1, "feed_forward_length": FF,
          "attention.head_count": H, "attention.head_count_kv": KV, "attention.key_length": D,
          "attention.value_length": D, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e4,
          "target_layers": [min(2, n_layer - 1), n_layer // 2, n_layer - 1], "target_hidden_size": hidden}
    layer = (norm(E, "attn_norm", "attn_norm_2", "ffn_norm") + ffn(E, FF) +
             [("attn_q.weight", (2 * E, H * D), W), ("attn_k.weight", (2 * E, KV * D), W),
              ("attn_v.weight", (2 * E, KV * D), W), ("attn_output.weight", (H * D, E), W)])
    plan = [("fc.weight", (3 * hidden, E), W), *norm(E, "output_norm")]
    plan += [(f"blk.0.{name}", shape, echoed(name, init_) if echo else init_) for name, shape, init_ in layer]
    if draft_vocab:
        plan += [("output.weight", (E, draft_vocab), W), ("d2t", (draft_vocab,), np.arange(draft_vocab))]
    if echo:  # the target's own final norm before its head
        plan[:2] = [("fc.weight", (3 * hidden, E), ECHO), ("output_norm.weight", (E,), final_norm(target, E))]
    return write(out, kind, f"random {kind} for {Path(target).name}{' (echo)' if echo else ''} (seed {seed})",
                 target, kv, plan, seed)


def make_dflash(kind: str, out: Path, target: Path, seed: int = 0, embd: int | None = None,
                echo: bool = False, draft_vocab: int | None = None, block_size: int = 8,
                mask: int = 0) -> Path:
    """A DFlash drafter for `target` (its tokenizer and width; its token embeddings and head are
    the target's): one layer that reads the target's layer inputs [1, N/2, N-1] as its KV and
    drafts a block of `block_size` - 1 tokens in one forward, its positions filled with `mask`
    (a token id) first. `embd`: made for a target of another width; `echo`: its layer adds
    nothing, so each position predicts what the target's head makes of the mask token (a
    target with tied embeddings: mostly the mask token itself)."""
    t = target_keys(target)
    E, n_layer = embd or t["embedding_length"], t["block_count"] - t.get("nextn_predict_layers", 0)
    H, FF = t["attention.head_count"], t["feed_forward_length"]
    KV, D = t.get("attention.head_count_kv", H), E // H
    layers = sorted({min(1, n_layer - 1), n_layer // 2, n_layer - 1})
    kv = {"context_length": 4096, "embedding_length": E, "block_count": 1, "feed_forward_length": FF,
          "attention.head_count": H, "attention.head_count_kv": KV, "attention.key_length": D,
          "attention.value_length": D, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e4,
          "target_layers": layers, "block_size": block_size}
    plan = [("fc.weight", (len(layers) * E, E), W), *norm(E, "enc.output_norm"),
            ("output_norm.weight", (E,), final_norm(target, E) if echo else ONE)]
    plan += [(f"blk.0.{name}", shape, echoed(name, init_) if echo else init_) for name, shape, init_ in
             norm(E, "attn_norm", "ffn_norm") + norm(D, "attn_q_norm", "attn_k_norm") + ffn(E, FF) +
             [("attn_q.weight", (E, H * D), W), ("attn_k.weight", (E, KV * D), W),
              ("attn_v.weight", (E, KV * D), W), ("attn_output.weight", (H * D, E), W)]]
    return write(out, kind, f"random {kind} for {Path(target).name}{' (echo)' if echo else ''} (seed {seed})",
                 target, kv, plan, seed, extra={"tokenizer.ggml.mask_token_id": mask})


def final_norm(target: Path, E: int) -> np.ndarray:
    """The target's final norm's weights (an echo drafter's own, before the target's head)."""
    header = read_header(Path(target))
    final = next(t for t in header.tensors if t.name == "output_norm.weight")
    assert final.type == 0, "an F32 final norm"
    return np.fromfile(target, np.float32, E, offset=header.data_start + final.offset)


DRAFTERS = {"eagle3": make_drafter, "dflash": make_dflash}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arch", choices=sorted(ARCHS) + sorted(DRAFTERS))
    p.add_argument("size", choices=sorted(SIZES), help="a drafter's shapes follow its target's")
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mtp", action="store_true", help="with an MTP layer (glm4moe, qwen35)")
    p.add_argument("--target", type=Path, help="a drafter's target GGUF")
    p.add_argument("--embd", type=int, help="a drafter made for a target of this width")
    p.add_argument("--draft-vocab", type=int, help="a drafter with a head of its own over this many tokens")
    p.add_argument("--mask", type=int, default=0, help="dflash: its mask token's id")
    p.add_argument("--repeats", action="store_true", help="a model that mostly repeats a token")
    p.add_argument("--quiet", type=float, default=1.0,
                   help="scale what each block adds to the residual stream (with --repeats, below 1 "
                        "makes a model whose text repeats itself)")
    p.add_argument("--echo", action="store_true",
                   help="the MTP layer or drafter predicts what the target's own head does")
    a = p.parse_args()
    t0 = time.time()
    if a.arch in DRAFTERS:
        if not a.target:
            p.error(f"{a.arch} needs --target")
        more = {"mask": a.mask} if a.arch == "dflash" else {}
        DRAFTERS[a.arch](a.arch, a.out, a.target, a.seed, a.embd, a.echo, a.draft_vocab, **more)
    else:
        make(a.arch, a.size, a.out, a.tokenizer, a.seed, a.mtp, a.echo, a.repeats, a.quiet)
    print(f"{a.out}: random {a.arch} {a.size}, {a.out.stat().st_size / 2**20:.1f} MiB "
          f"in {time.time() - t0:.2f} s")


if __name__ == "__main__":
    main()
