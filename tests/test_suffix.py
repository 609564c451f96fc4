"""The suffix drafter and its store: the native search against brute force, the files on disk
(reopened, torn, corrupt, bounded, shared), and the engine learning from its answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec import _native
from localspec.drafters.base import Budget
from localspec.drafters.spec import DrafterSpec
from localspec.drafters.suffix import BYTES_PER_TOKEN, SuffixDrafter, SuffixStore, store_dir
from localspec.engine import Engine, EngineConfig, Request
from localspec.llama.curve import CostCurve
from localspec.sampling import SamplingConfig
from localspec.verify import Verdict

from conftest import RECORDED_CURVE

KEY = "tokenizer-of-the-test"


def brute_force(docs: list[list[int]], context: list[int], max_match: int):
    """The longest suffix of context occurring in docs, and what follows each occurrence."""
    for m in range(min(max_match, len(context)), 0, -1):
        pattern = context[len(context) - m:]
        follow = [d[i + m:] for d in docs for i in range(len(d) - m + 1) if d[i:i + m] == pattern]
        if follow:
            return m, follow
    return 0, []


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8),
       context=st.lists(st.integers(0, 3), min_size=1, max_size=10),
       min_share=st.sampled_from([0.0, 0.1, 0.3, 0.5]), reopened=st.booleans())
def test_draft_is_the_suffix_tree_of_earlier_documents(docs, context, min_share, reopened):
    """The draft tree holds every continuation of the longest matching suffix that at least
    min_share of its occurrences took, with exact counts, whether the documents sit in one
    sorted array (a reopened store) or in several (added one by one)."""
    s = _native.SuffixStore()
    for d in docs:
        s.add(np.array(d, np.int32))
    if reopened:
        s2 = _native.SuffixStore()
        s2.load(s.corpus(), s.sorted())
        s = s2
    tokens, parents, counts, n_match, n_occ = s.draft(np.array(context, np.int32), 8, 1000, 6, 8.0, min_share)
    m, follow = brute_force(docs, context, 8)
    assert (n_match, n_occ) == (m, len(follow))
    # Every node: its path's count is how many occurrences continue that way.
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.insert(0, int(tokens[j]))
            j = parents[j]
        assert counts[i] == sum(f[:len(path)] == path for f in follow)
    # And every continuation (up to the depth) is in the tree.
    depth = 6  # min(max_depth, alpha * match length) with alpha = 8
    paths = {tuple(f[:k]) for f in follow for k in range(1, min(depth, len(f)) + 1)}
    paths = {p for p in paths if sum(f[:len(p)] == list(p) for f in follow) >= min_share * len(follow)}
    assert len(tokens) == len(paths)
    assert all(counts[i] <= counts[parents[i]] for i in range(len(tokens)) if parents[i] >= 0)


@pytest.mark.unit
def test_store_drafts_learn_from_proposals_nobody_verified():
    """A fresh drafter's store drafts (acceptance at the prior, at most 0.7) never pay on a
    curve where a batch of two costs 1.8 forwards, so none is verified; the proposals it made
    anyway, judged by the token that came next, teach it that the text is being copied, and
    it drafts the rest. Simulated greedy decoding: the target emits the stored document."""
    doc = list(range(1000, 1300))
    store = SuffixStore(None, KEY)
    store.add(doc)
    drafter = SuffixDrafter(store)
    curve = CostCurve(seconds=[1.0, 1.8, 2.4, 3.0, 3.6, 4.2, 4.8, 5.4], n_context=0)
    budget = Budget(curve, n_seq_max=4)
    context = [1, 2, 3] + doc[:2]
    drafter.begin(context, SamplingConfig())
    verified = []
    while len(context) < 3 + len(doc):
        tree = budget.size(drafter.propose(context, budget))
        n, _ = tree.walk(doc[len(context) - 3:])
        if len(tree):  # as the loop: only what was verified is observed
            drafter.observe(tree, Verdict(list(range(n)), [], False, n))
        verified.append(len(tree))
        context += doc[len(context) - 3:len(context) - 3 + n + 1]
    assert verified[0] == 0
    assert sum(verified) > len(doc) / 2
    # Deep into the copy (depths count from where the text began to follow it) it goes on.
    assert drafter.acceptance.rate(24, 20) > 0.9 and drafter.acceptance.rate(24, 40) > 0.9


@pytest.mark.unit
def test_a_sure_draft_from_the_requests_own_text_skips_the_store():
    """A request copying its own text (an edit of the code it quotes) drafts from that text
    without searching the store, where an earlier version of the code matches as long and
    then goes stale at the edit; a request whose own text gives no sure draft searches it."""
    code = list(range(2000, 2040))
    store = SuffixStore(None, KEY)
    store.add([1] + code[:20] + [9999] + code[21:])  # the earlier version, edited at token 20
    curve = CostCurve(seconds=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], n_context=0)
    budget = Budget(curve, n_seq_max=4)
    for context, own in (([5, 6] + code + [7, 8] + code[:10], True), ([5, 6] + code[:10], False)):
        drafter = SuffixDrafter(store)
        drafter.begin(context, SamplingConfig())
        tree = drafter.propose(context, budget)
        assert tree.tokens[:5].tolist() == code[10:15]  # from its own text, else the store
        assert bool(drafter.acceptance._open) != own  # a store draft opens a judgement


@pytest.mark.unit
def test_eviction_rollback_and_snapshot_round_trip():
    s = _native.SuffixStore()
    for d in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]):
        s.add(np.array(d, np.int32))
    s.keep_first(2)
    assert sorted(s.draft(np.array([2, 3], np.int32), 8, 10, 4, 4.0)[0][:2]) == [4, 5]
    s.keep_newest(4)  # the oldest document goes
    assert s.draft(np.array([2, 3], np.int32), 8, 10, 4, 4.0)[0].tolist() == [5]
    t = _native.SuffixStore()
    t.load(s.corpus(), s.sorted())
    assert t.draft(np.array([2, 3], np.int32), 8, 10, 4, 4.0)[0].tolist() == [5]
    bad = _native.SuffixStore()
    for corpus, sa in (([1, 2, -1], [1, 0]), ([1, 2], [0, 1]), ([1, 2, -1], [0])):
        try:
            bad.load(np.array(corpus, np.int32), np.array(sa, np.uint32))
            raise AssertionError(f"accepted {corpus} {sa}")
        except ValueError:
            pass


def test_store_survives_reopening_a_torn_write_and_a_corrupt_index(tmp_path, capsys):
    s = SuffixStore(tmp_path, KEY)
    s.add([1, 2, 3, 4])
    s.add([5, 6, 7])
    s.close()
    assert SuffixStore(tmp_path, KEY).native.n_docs == 2
    with open(tmp_path / "answers.log", "ab") as f:  # a crash in the middle of a record
        f.write(b"\x09\x00\x00\x00\x01\x02")
    s = SuffixStore(tmp_path, KEY)
    assert s.native.corpus().tolist() == [1, 2, 3, 4, -1, 5, 6, 7, -1]
    s.add([8, 9])
    (tmp_path / "index.bin").write_bytes(b"\x00" * 100)  # bit rot: rebuilt from the log
    assert SuffixStore(tmp_path, KEY).native.n_docs == 3
    assert "torn record" in capsys.readouterr().err


def test_a_store_for_another_tokenizer_is_refused_in_one_line(tmp_path):
    SuffixStore(tmp_path, KEY).add([1, 2])
    try:
        SuffixStore(tmp_path, "another-tokenizer")
        raise AssertionError("opened")
    except Exception as e:  # noqa: BLE001
        assert "another tokenizer" in str(e) and "\n" not in str(e)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "answers.log").write_bytes(b"not a store")
    try:
        SuffixStore(tmp_path / "other", KEY)
        raise AssertionError("opened")
    except Exception as e:  # noqa: BLE001
        assert "not a localspec suffix store" in str(e)
    assert (tmp_path / "other" / "answers.log").read_bytes() == b"not a store"  # left intact


def test_store_is_bounded_and_keeps_the_newest(tmp_path):
    bound = 100 * BYTES_PER_TOKEN
    s = SuffixStore(tmp_path, KEY, max_bytes=bound)
    for i in range(40):
        s.add(list(range(i * 10, i * 10 + 10)))
    assert s.native.n_tokens * BYTES_PER_TOKEN <= bound
    reopened = SuffixStore(tmp_path, KEY, max_bytes=bound)
    assert reopened.native.corpus().tolist()[-11:] == list(range(390, 400)) + [-1]
    assert (tmp_path / "answers.log").stat().st_size < 2 * bound


def test_two_processes_share_a_store(tmp_path):
    """A second process (a server beside the chat app) appends; the first sees its answers
    before writing its own, and the log stays whole."""
    a = SuffixStore(tmp_path, KEY)
    a.add([1, 2, 3])
    code = ("import sys; from pathlib import Path; from localspec.drafters.suffix import SuffixStore; "
            f"SuffixStore(Path(sys.argv[1]), {KEY!r}).add([4, 5, 6])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    a.add([7, 8])
    assert a.native.corpus().tolist() == [1, 2, 3, -1, 4, 5, 6, -1, 7, 8, -1]
    assert SuffixStore(tmp_path, KEY).native.n_docs == 3


def test_engine_learns_every_answer_and_drafts_from_it_losslessly(small_path, tmp_path):
    """An answer the user asks for again drafts from the store; the output is plain decoding's.
    Planned on a CPU's recorded curve, where a fresh drafter's store drafts (acceptance at the
    prior) do not pay: the proposals it makes anyway teach it that the answer is being
    repeated."""
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2, store=str(tmp_path),
                                 curve=str(RECORDED_CURVE)))
    try:
        messages = [{"role": "user", "content": "List the planets of the solar system, one per line."}]
        run = lambda d: [e for e in engine.generate(Request(messages=messages, max_tokens=48,  # noqa: E731
                                                             drafter=DrafterSpec.parse(d)))][-1]
        plain = run("none")
        assert engine.drafters.suffix_store().native.n_docs == 1  # learnt though no drafter ran
        again = run("suffix")
        assert again.tokens == plain.tokens
        assert again.stats.draft_n_accepted >= len(plain.tokens) // 2
        assert engine.drafters.suffix_store().native.n_docs == 2
        assert DrafterSpec("suffix") in engine.drafters.available()
    finally:
        engine.close()
    assert SuffixStore(tmp_path, engine.model.tokenizer_hash).native.n_docs == 2  # on disk


def test_index_command_and_a_store_of_another_tokenizer(small_path, qwen_path, tmp_path):
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("def area(width, height):\n    return width * height\n")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (src / "blob.bin").write_bytes(b"\x00\xff" * 10)
    store = tmp_path / "store"
    env = dict(os.environ)
    cli = [sys.executable, "-m", "localspec.cli"]
    out = subprocess.run(cli + ["index", "-m", str(small_path), "--store", str(store), str(src)],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "indexed 1 files" in out.stdout
    out = subprocess.run(cli + ["generate", "-m", str(qwen_path), "--drafter", f"suffix:{store}", "hi"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and "another tokenizer" in out.stderr


def test_default_store_lives_per_tokenizer(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALSPEC_SUFFIX_DIR", str(tmp_path))
    assert store_dir("abcdef" * 10) == tmp_path / ("abcdef" * 10)[:16]


def test_a_broken_default_store_is_said_once_and_left_intact(small_path, tmp_path, monkeypatch, capsys):
    """Answers are still written (auto drafts with prompt lookup instead); the file that is
    not a store stays as it was."""
    monkeypatch.setenv("LOCALSPEC_SUFFIX_DIR", str(tmp_path))
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2))
    try:
        broken = store_dir(engine.model.tokenizer_hash)
        broken.mkdir(parents=True)
        (broken / "answers.log").write_bytes(b"something else entirely")
        for _ in range(2):
            *_, done = engine.generate(Request(prompt="The sky is", max_tokens=8))
            assert done.reason == "length"
        assert engine.drafters.available()[0] == DrafterSpec("lookup")
        err = capsys.readouterr().err
        assert err.count("not a localspec suffix store") == 1
        assert (broken / "answers.log").read_bytes() == b"something else entirely"
    finally:
        engine.close()
