"""Shared fixtures: real models from the test store, and nothing of the user's.

The suite never reads or writes the user's localspec directories: LOCALSPEC_HOME (models,
caches, cost curves, suffix stores, chats) is a fresh folder, set here before any test runs
so that subprocesses inherit it too. The models come from a shared test store, pulled
(sha256-checked) on first use and only read after that: LOCALSPEC_TEST_MODELS, else
localspec-test-models in the user's cache folder."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import platformdirs
import pytest

if not os.environ.get("LOCALSPEC_TEST_RUN"):  # a test's own subprocess shares its run's
    os.environ["LOCALSPEC_TEST_RUN"] = "1"
    os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="localspec-test-home-")
    # Engines plan on the coarse curve and do not measure the whole one between requests: an
    # idle server measuring beside the test that uses it would slow both (test_engine.py tests
    # that measurement).
    os.environ["LOCALSPEC_REFINE_CURVE"] = "0"
    if not os.environ.get("LOCALSPEC_KEEP_TEST_HOME"):  # kept to look into what a run wrote
        atexit.register(shutil.rmtree, os.environ["LOCALSPEC_HOME"], ignore_errors=True)
TEST_MODELS = Path(os.environ.get("LOCALSPEC_TEST_MODELS") or
                   platformdirs.user_cache_dir("localspec-test-models"))
os.environ["LOCALSPEC_MODEL_DIRS"] = str(TEST_MODELS)

from localspec import pull, store  # noqa: E402
from localspec.llama import Context, Model  # noqa: E402
from localspec.llama.context import ContextConfig  # noqa: E402

SMALL = "smollm2-135m-instruct"
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"
# A cost curve recorded once (SmolLM2 on two threads of the 2-core machine that CI runs on):
# tests that plan drafts plan with it, never with whatever this machine measured last.
RECORDED_CURVE = Path(__file__).parent / "data" / "smollm2-2-threads.curve.json"


def from_test_store(name: str) -> Path:
    """A registry model from the test store, pulled there if it is not yet."""
    path = TEST_MODELS / f"{name}.gguf"
    return path if path.exists() else pull.pull(name, into=TEST_MODELS)


@pytest.fixture(scope="session")
def test_models():
    """Both test models before any model test: what a drafter finds beside a target (auto's
    draft model) is then the same in every run, whichever test comes first."""
    return {name: from_test_store(name) for name in (SMALL, QWEN_SMALL)}


@pytest.fixture(autouse=True)
def _models_first(request):
    """Every test but the unit tier's (marked `unit`: no model on disk) has the models first."""
    if request.node.get_closest_marker("unit") is None:
        request.getfixturevalue("test_models")


@pytest.fixture(scope="session")
def small_path(test_models):
    return test_models[SMALL]


@pytest.fixture(scope="session")
def tiny_moe_path(tmp_path_factory, small_path):
    """A tiny random-weight qwen3moe (random_gguf.py) with SmolLM2's tokenizer: a real llama.cpp
    model whose forwards take a millisecond, for what does not depend on what weights say."""
    from random_gguf import make
    return make("qwen3moe", "tiny", tmp_path_factory.mktemp("moe") / "qwen3moe.gguf", tokenizer=small_path)


@pytest.fixture(scope="session")
def qwen_path(test_models):
    return test_models[QWEN_SMALL]


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
