"""A context's link to its model's exact head (native/head.h): on the CPU, greedy rows read
their argmax from a 4-bit copy of the output layer, the few rows that could beat its pick
computed as llama.cpp computes them. The link is llama.cpp's eval callback, which must be in
the context's parameters before the context exists."""

from __future__ import annotations

import ctypes

import llama_cpp as ll

from localspec import _native
from localspec.llama.model import Model


def hook_into(model: Model, exact_head: bool, params: ll.llama_context_params) -> _native.HeadHook | None:
    """The hook for a context about to be made with `params`, its callback set in them; None
    where the context is not to have one or the model has no head (Model.exact_head). It must
    live as long as the context: llama.cpp calls it on every forward."""
    head = model.exact_head(params.n_threads) if exact_head else None
    if head is None:
        return None
    hook = _native.HeadHook(head)
    params.cb_eval = ctypes.cast(hook.callback, type(params.cb_eval))
    params.cb_eval_user_data = hook.address
    return hook


def bound(hook: _native.HeadHook | None, ctx_ptr) -> _native.HeadHook | None:
    """The hook once tied to its context, or None where the head does not reproduce the
    context's logits (checked on a few rows: an architecture whose logits are not the plain
    matmul of the layer's input); an unbound hook stays idle."""
    return hook if hook is not None and hook.bind(ctx_ptr) else None
