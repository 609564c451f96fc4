"""Shared fixtures: real models pulled through localspec's own store."""

from __future__ import annotations

import os
import tempfile

import pytest

from localspec import store
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig

SMALL = "smollm2-135m-instruct"
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"

# Every engine learns its answers into a suffix store: the tests' go to a fresh place (set
# here, before any engine exists, so subprocesses inherit it too), not into the user's.
os.environ["LOCALSPEC_SUFFIX_DIR"] = tempfile.mkdtemp(prefix="localspec-suffix-")


@pytest.fixture(scope="session")
def small_path():
    return store.resolve(SMALL)


@pytest.fixture(scope="session")
def qwen_path():
    return store.resolve(QWEN_SMALL)


@pytest.fixture(scope="session")
def small_model(small_path):
    with Model(small_path) as m:
        yield m


@pytest.fixture(scope="session")
def qwen_model(qwen_path):
    with Model(qwen_path) as m:
        yield m


@pytest.fixture
def small_ctx(small_model):
    with Context(small_model, ContextConfig(n_ctx=2048, n_seq_max=8)) as ctx:
        yield ctx


@pytest.fixture(scope="session")
def target(small_model):
    """SmolLM2 on one thread, where batched forwards reproduce single tokens exactly (see
    test_speculative.py), for every module that compares speculative with plain decoding."""
    with Context(small_model, ContextConfig(n_ctx=1024, n_seq_max=8, n_threads=1)) as ctx:
        yield ctx


@pytest.fixture(scope="session")
def reference(target):
    """Plain greedy output of test_speculative's 20 prompts, computed once per session."""
    from test_speculative import PROMPTS as SPEC_PROMPTS, plain
    return {p: plain(target, target.model.tokenize(p)) for p in SPEC_PROMPTS}
