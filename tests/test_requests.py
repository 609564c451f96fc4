"""The engine as long-lived surfaces use it: many requests with different settings on one
engine, text streamed as events, stop strings, cancellation, and a prompt cache that never
changes an answer."""

import os
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Delta, Done, Engine, EngineConfig, Request
from localspec.llama.text import TextStream
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0)
REVERSE = [{"role": "user", "content": "Write a Python function that reverses a string."}]


def answer(engine: Engine, request: Request, cancel=None) -> tuple[list, Done]:
    """(the Delta events, the Done event) of a request run to its end."""
    events = list(engine.generate(request, cancel))
    assert isinstance(events[-1], Done) and all(isinstance(e, Delta) for e in events[:-1])
    return events[:-1], events[-1]


def cold(engine: Engine, request: Request) -> Done:
    """The request as from a cold start: nothing in the cache."""
    engine.ctx.clear()
    return answer(engine, request)[1]


def rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def smol(small_path):
    """SmolLM2 on two threads: batches are not bit-identical to single tokens there, so the
    cache tests below mean something."""
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def qwen(qwen_path):
    """Qwen2.5-Coder-0.5B on two threads, where the issue's reproduction was seen."""
    engine = Engine(EngineConfig(model=str(qwen_path), n_ctx=2048, threads=2,
                                 drafter=DrafterSpec("lookup")))
    yield engine
    engine.close()


@pytest.mark.unit
def test_every_kind_of_drafter_registers_its_factory():
    """What the engine builds a drafter with: one factory per kind a spec may name (auto and
    none build none: a controller, plain decoding)."""
    from localspec.drafters.loaded import FACTORIES
    from localspec.drafters.spec import KINDS
    assert set(FACTORIES) == set(KINDS) - {"auto", "none"}


def test_100_requests_load_each_drafter_once_with_flat_memory(smol, small_path):
    """Random seeds, temperatures, drafters and lengths on one engine: every drafter model is
    loaded once, whatever the sampling, and memory stops growing after warm-up."""
    smol_draft = f"draft:{small_path}"
    specs = [DrafterSpec.parse(s) for s in (
        "none", "lookup", "lookup@3", "auto", "jakiro", "jakiro@2", "jakiro,cepd=off,width=2",
        smol_draft, f"{smol_draft}@2", f"draft-tree:{small_path}@4", f"{smol_draft},head=off")]
    prompts = ["def add(a, b):\n", "The capital of France is", "1, 2, 3, 4,", "Dear Sir,\n"]
    rng = random.Random(0)
    sizes = []
    for i in range(100):
        sampling = SamplingConfig(temperature=rng.choice([0.0, 0.0, 0.7, 1.0, 1.5]),
                                  seed=rng.randrange(1 << 30))
        request = Request(prompt=rng.choice(prompts), sampling=sampling, drafter=rng.choice(specs),
                          max_tokens=rng.randrange(4, 24))
        _, done = answer(smol, request)
        assert 1 <= done.stats.predicted_n <= request.max_tokens
        if i in (39, 99):
            sizes.append(rss())
    assert smol.loads[str(small_path)] == 2, smol.loads  # the target, and once as a draft model
    assert all(n == 1 for path, n in smol.loads.items() if path != str(small_path)), smol.loads
    assert len(smol.loads) == 2  # and the shipped Jakiro drafter
    assert sizes[1] <= sizes[0] * 1.05, sizes


def test_a_closed_stream_then_the_same_request_equals_a_cold_start(smol):
    # Lookup, not auto: Cascade's choices follow this machine's timing, and other batches
    # may round a near-tie the other way (--strict aside).
    request = Request(prompt="def fibonacci(n):\n", sampling=GREEDY, max_tokens=64,
                      drafter=DrafterSpec("lookup"))
    reference = cold(smol, request)
    stream = smol.generate(request)
    for i, event in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert smol.generate(request) is not None  # the engine takes the next request
    _, again = answer(smol, request)
    assert again.tokens == reference.tokens and again.text == reference.text


def test_cancel_stops_within_one_iteration(smol):
    request = Request(prompt="Once upon a time,", sampling=GREEDY, max_tokens=200)
    cancel = threading.Event()
    seen = 0
    for event in smol.generate(request, cancel):
        if isinstance(event, Delta):
            seen += event.n_tokens
            if seen >= 5:
                cancel.set()
                after = seen
        else:
            done = event
    assert done.reason == "cancelled"
    assert done.stats.predicted_n == after  # no iteration ran after the flag was seen
    assert cold(smol, request).tokens[:after] == done.tokens


def test_a_request_while_another_streams_on_the_same_thread_is_refused(smol):
    first = smol.generate(Request(prompt="Hello", max_tokens=8))
    next(first)
    with pytest.raises(LocalspecError, match="still running"):
        next(smol.generate(Request(prompt="Hello", max_tokens=8)))
    first.close()
    answer(smol, Request(prompt="Hello", max_tokens=4))


def test_stop_strings_split_across_tokens_never_appear(smol):
    request = Request(prompt="def fibonacci(n):\n", sampling=GREEDY, max_tokens=48)
    full = cold(smol, request)
    model = smol.model
    # A stop string that begins inside one token and ends inside a later one.
    pieces = [model.token_bytes(t).decode("utf-8", "replace") for t in full.tokens]
    k = next(i for i in range(5, len(pieces)) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    start = len("".join(pieces[:k])) + len(pieces[k]) - 1
    stop = full.text[start:start + 3]
    deltas, done = answer(smol, Request(prompt=request.prompt, sampling=GREEDY, max_tokens=48,
                                        stop=(stop, "never appears")))
    assert done.reason == "stop" and stop not in done.text
    assert done.text == full.text[:full.text.index(stop)]
    assert "".join(d.text for d in deltas) == done.text


def test_every_verification_forward_reaches_the_live_cost_curve(small_path):
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2, drafter=DrafterSpec("lookup")))
    try:
        # Counted apart from the corrections, which may start from an earlier engine's (resume).
        assert engine.planning.prepare().stray()[0] == 0
        *_, done = engine.generate(Request(prompt="def fibonacci(n):\n", sampling=GREEDY, max_tokens=48))
        # One per iteration: the prompt's forwards are not verifications.
        assert engine.curve.stray()[0] == done.stats.forwards > 0
        assert engine.curve.factors()[0, 0] != 1.0  # in the last shape (a CPU pads nothing), one token
    finally:
        engine.close()


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab \n.é🙂", min_size=1, max_size=40), data=st.data())
def test_text_stream_gives_everything_before_the_first_stop(small_model, text, data):
    """Real SmolLM2 tokens of random text, random stop strings (some of the text, some not):
    the text given out is what came before the first stop string to appear in full (as
    tokens arrive), and what is held back could still begin one."""
    tokens = small_model.tokenize(text, add_special=False)
    full = small_model.detokenize(tokens)
    stops = data.draw(st.lists(st.one_of(
        st.builds(lambda i, n: full[i:i + n], st.integers(0, len(full)), st.integers(1, 4)),
        st.text(alphabet="ab.é", min_size=1, max_size=3)), max_size=3))
    stream = TextStream(small_model, stops)
    out = []
    for i, t in enumerate(tokens):
        stream.feed(t, "lookup" if i % 2 else None)
        out += stream.take()
        if stream.stopped:
            break
        given = "".join(t for t, _ in out)
        held = "".join(t for t, _ in stream.held)
        assert given + held == small_model.detokenize(tokens[:i + 1]).rstrip("\ufffd")
        # Held back: only text from where a stop string could still begin.
        assert not held or any(s.startswith(held[:len(s)]) for s in stops)
    out += stream.take(final=True)
    expected = full
    for n in range(1, len(tokens) + 1):
        so_far = small_model.detokenize(tokens[:n]).rstrip("\ufffd")
        found = [so_far.find(s) for s in stops if s and s in so_far]
        if found:
            expected = so_far[:min(found)]
            break
    assert "".join(t for t, _ in out) == stream.text == expected


@pytest.mark.slow
def test_the_same_request_twice_and_an_extended_prompt_equal_a_cold_start(qwen):
    """The issue's reproduction: Qwen2.5-Coder-0.5B on two threads answered this chat
    differently warm and cold. Then a completion prompt, extended as an editor's next
    request extends it. Plain decoding: with a drafter, what it learnt from the first answer
    sizes its drafts in the second, and batches of another shape may flip a measured tie
    (allowed, and tested with the drafters); this is about the cache."""
    chat = Request(messages=REVERSE, sampling=GREEDY, max_tokens=24, drafter=NONE)
    first = cold(qwen, chat)
    _, again = answer(qwen, chat)
    assert again.stats.prompt_n == 0  # nothing decoded
    assert again.tokens == first.tokens
    code = "import os\nimport sys\n\n\n" + "def parse(line):\n    key, value = line.split('=')\n" * 12
    base = Request(prompt=code, sampling=GREEDY, max_tokens=16, drafter=NONE)
    extended = Request(prompt=code + "    return {key: value}\n\n\ndef main():\n", sampling=GREEDY,
                       max_tokens=24, drafter=NONE)
    reference = cold(qwen, extended)
    answer(qwen, base)
    _, warm = answer(qwen, extended)
    assert warm.stats.cache_n > 0 and warm.tokens == reference.tokens


@pytest.mark.parametrize("which", ["smol", pytest.param("qwen", marks=pytest.mark.slow)])
def test_turn_two_of_a_chat_decodes_only_its_new_tokens(which, request):
    """Through the chat template: the previous answer's tokens and its end of turn are what the
    template renders next time, so turn 2 reuses all of turn 1 up to the last whole chunk."""
    engine = request.getfixturevalue(which)
    engine.ctx.clear()
    turn1 = engine.prompt_tokens(Request(messages=REVERSE))
    _, one = answer(engine, Request(messages=REVERSE, sampling=GREEDY, max_tokens=40))
    assert one.reason == "eog" or len(one.tokens) == 40
    messages = REVERSE + [{"role": "assistant", "content": one.text},
                          {"role": "user", "content": "Now make it handle None."}]
    turn2 = engine.prompt_tokens(Request(messages=messages))
    # The template renders what was generated, and the end of turn where generation ended.
    assert turn2[:len(turn1) + len(one.tokens)] == turn1 + one.tokens
    in_cache = len(turn1) + len(one.tokens) - 1  # all but the last token emitted
    _, two = answer(engine, Request(messages=messages, sampling=GREEDY, max_tokens=8))
    chunk = engine.ctx.chunk
    assert two.stats.cache_n == in_cache // chunk * chunk
    assert two.stats.prompt_n == len(turn2) - two.stats.cache_n < len(turn2) - in_cache + chunk
