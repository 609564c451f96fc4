"""`localspec serve` as a real process on a loopback port: the official openai client, llama.vim's
and llama.vscode's request bodies exactly as they send them, disconnects, many clients at once,
bad requests, fuzzing from the schema, and memory over many requests."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from localspec.bench.anchors import free_port
from localspec.bench.runner import near_tie
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig, Request
from localspec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0)

# llama.vim (ggml-org/llama.vim, autoload/llama.vim): the ring-buffer warm-up, then a completion,
# field by field as s:ring_update() and llama#fim() build them (Vim's json_encode of reltime()
# gives a list of two ints for `time`; `model` is always sent, "" by default).
VIM_EXTRA = [{"text": "def helper(x):\n    return x * 2\n", "time": [1738312345, 123456],
              "filename": "util.py"}]
VIM_WARMUP = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": VIM_EXTRA, "prompt": "",
              "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
              "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""], "model": ""}
VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
VIM_FIM = {"id_slot": 0, "input_prefix": "import os\n\n\ndef list_files(path):\n",
           "input_suffix": "\n\n\nif __name__ == \"__main__\":\n    print(list_files(\".\"))\n",
           "input_extra": VIM_EXTRA, "prompt": "    ", "n_predict": 128, "stop": [], "n_indent": 4,
           "top_k": 40, "top_p": 0.9, "samplers": ["top_k", "top_p", "infill"], "stream": False,
           "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 250,
           "response_fields": VIM_FIELDS, "model": ""}
# llama.vscode (ggml-org/llama.vscode, src/llama-server.ts createRequestPayload): the warm-up
# (noPredict) and a completion with its defaults (n_cmpl 3, n_indent omitted when 0).
CODE_EXTRA = [{"text": "def helper(x):\n    return x * 2\n", "time": 1738312345123, "filename": "/home/me/p/util.py"}]
CODE_WARMUP = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": CODE_EXTRA, "prompt": "",
               "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
CODE_FIM = {"id_slot": 0, "input_prefix": VIM_FIM["input_prefix"], "input_suffix": VIM_FIM["input_suffix"],
            "input_extra": CODE_EXTRA, "prompt": "    ", "n_predict": 128, "n_cmpl": 3, "top_k": 40,
            "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 500}


@contextmanager
def serving(model, *args, threads: int = 1, ctx: int = 1024, env: dict | None = None):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localspec.cli", "serve", "-m", str(model), "--port", str(port),
                             "--threads", str(threads), "--ctx", str(ctx), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=None if env is None else {**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def smol(small_path):
    """SmolLM2 on one thread with flash attention on (batches of up to 12 rows bit-identical to
    single tokens: a short speculative answer is plain output byte for byte; without it, the
    default on a CPU, no batch is), with its default drafter, auto."""
    with serving(small_path, "--flash-attn", "on") as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def coder(qwen_path):
    """Qwen2.5-Coder-0.5B, which has FIM tokens, as the editors' server."""
    with serving(qwen_path, "--drafter", "lookup", threads=2, ctx=4096) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def reference(small_path):
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=1, flash_attn="on",
                                 drafter=DrafterSpec("none")))
    yield engine
    engine.close()


def greedy(engine: Engine, **request):
    engine.ctx.clear()
    *_, done = engine.generate(Request(sampling=GREEDY, **request))
    return done


def plain(engine: Engine, **request) -> str:
    return greedy(engine, **request).text


def same_or_tie(engine: Engine, prompt: str, max_tokens: int, served: str) -> bool:
    """The server's greedy text is plain decoding's, or first leaves it at a token whose two
    best logits lie within the engine's measured discrepancy (a long answer verifies batches
    wide enough to round differently from single tokens, where they are padded too)."""
    done = greedy(engine, prompt=prompt, max_tokens=max_tokens)
    if served == done.text:
        return True
    k = next(k for k in range(len(done.tokens)) if not served.startswith(engine.model.detokenize(done.tokens[:k + 1])))
    return near_tie(engine, engine.model.tokenize(prompt), done.tokens, done.tokens[:k] + [-1])


CHAT = [{"role": "user", "content": "Write a haiku about the sea."}]


def test_openai_client_gets_the_engines_greedy_text(smol, reference):
    from openai import OpenAI
    client = OpenAI(base_url=smol[0] + "/v1", api_key="unused")
    expected = plain(reference, messages=CHAT, max_tokens=48)
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=48, temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    chunks = list(client.chat.completions.create(model="any", messages=CHAT, max_tokens=48, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens and chunks[-1].choices == []
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    text = "The capital of France is"
    c = client.completions.create(model="any", prompt=text, max_tokens=24, temperature=0)
    assert c.choices[0].text == plain(reference, prompt=text, max_tokens=24)
    streamed = "".join(x.choices[0].text for x in client.completions.create(
        model="any", prompt=text, max_tokens=24, temperature=0, stream=True))
    assert streamed == c.choices[0].text
    assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]
    # free text asked for in so many words, and no tools, is what it always answers
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=48, temperature=0,
                                       response_format={"type": "text"}, tools=[])
    assert r.choices[0].message.content == expected


def test_openai_logprobs_are_the_engines(smol, reference):
    """logprobs through the OpenAI client, chat and text, streamed or not: each token's text
    and bytes, its log-probability and alternatives are plain decoding's (one thread: batched
    rows are single tokens' bit for bit), the tokens make the text, the stream's the same."""
    from openai import OpenAI
    client = OpenAI(base_url=smol[0] + "/v1", api_key="unused")
    reference.ctx.clear()
    *events, done = reference.generate(Request(messages=CHAT, max_tokens=24, sampling=SamplingConfig(logprobs=2)))
    want = [lp for e in events for lp in e.logprobs]
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=24, temperature=0, logprobs=True,
                                       top_logprobs=2)
    got = r.choices[0].logprobs.content
    assert r.choices[0].message.content == done.text
    assert b"".join(bytes(t.bytes) for t in got).decode() == done.text
    assert [t.token for t in got] == [reference.model.token_bytes(lp.token).decode() for lp in want]
    assert [t.logprob for t in got] == pytest.approx([lp.logprob for lp in want], abs=1e-6)
    assert [[a.logprob for a in t.top_logprobs] for t in got] == [
        pytest.approx([p for _, p in lp.top], abs=1e-6) for lp in want]
    assert all(t.top_logprobs[0].token == t.token for t in got)  # greedy: the likeliest
    streamed = [t for c in client.chat.completions.create(model="any", messages=CHAT, max_tokens=24, temperature=0,
                                                          logprobs=True, top_logprobs=2, stream=True)
                if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in got]
    assert client.chat.completions.create(model="any", messages=CHAT, max_tokens=4).choices[0].logprobs is None
    text = "The capital of France is"
    c = client.completions.create(model="any", prompt=text, max_tokens=12, temperature=0, logprobs=3).choices[0]
    assert "".join(c.logprobs.tokens) == c.text and len(c.logprobs.top_logprobs[0]) <= 3
    assert c.logprobs.text_offset == [sum(map(len, c.logprobs.tokens[:i])) for i in range(len(c.logprobs.tokens))]
    assert all(max(top.values()) >= lp for top, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs))
    native = httpx.post(smol[0] + "/completion", json={"prompt": text, "n_predict": 12, "temperature": 0,
                                                       "n_probs": 3}, timeout=60).json()
    assert [p["token"] for p in native["completion_probabilities"]] == c.logprobs.tokens
    assert [p["logprob"] for p in native["completion_probabilities"]] == pytest.approx(c.logprobs.token_logprobs)
    assert [len(p["top_logprobs"]) for p in native["completion_probabilities"]] == [3] * len(c.logprobs.tokens)


def test_stream_chunks_are_one_line_of_compact_json(smol):
    with httpx.stream("POST", smol[0] + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8,
                                                                      "temperature": 0, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: {") for line in lines[:-1])
    first = json.loads(lines[0][6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert '"timings":' in lines[-2]
    for line in lines[:-1]:  # compact: what json.dumps writes with no spaces
        assert line[6:] == json.dumps(json.loads(line[6:]), separators=(",", ":"), ensure_ascii=False)


def vim_post(url: str, body: dict) -> str:
    """POST as llama.vim does: curl with these flags, the body on stdin, and always an
    Authorization header (with its default, empty key)."""
    r = subprocess.run(["curl", "--silent", "--no-buffer", "--request", "POST", "--url", url,
                        "--header", "Content-Type: application/json", "--data", "@-",
                        "--header", "Authorization: Bearer "], input=json.dumps(body),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_llama_vim_bodies_and_what_it_parses(coder):
    url = coder[0]
    assert json.loads(vim_post(url + "/infill", VIM_WARMUP)) == {}
    raw = vim_post(url + "/infill", VIM_FIM)
    # s:fim_on_response: a quick check before decoding, then flat keys with slashes.
    assert re.match(r"^\s*\{", raw) and re.search(r'"content"\s*:"', raw) and "\n" not in raw
    body = json.loads(raw)
    assert set(body) == set(VIM_FIELDS) and isinstance(body["content"], str)
    assert isinstance(body["timings/prompt_n"], int) and isinstance(body["timings/predicted_ms"], float)
    assert body["tokens_cached"] > 0 and body["timings/prompt_n"] < body["tokens_cached"]
    # The warm-up put the extra chunk in the cache: the completion decoded less than its prompt.
    again = json.loads(vim_post(url + "/infill", VIM_FIM))
    assert again["content"] == body["content"] and again["timings/prompt_n"] <= 1


def test_llama_vscode_bodies_and_what_it_parses(coder):
    url = coder[0]
    warm = httpx.post(url + "/infill", json=CODE_WARMUP, timeout=120)
    assert warm.status_code == 200 and isinstance(warm.json()["generation_settings"], dict)
    data = httpx.post(url + "/infill", json=CODE_FIM, timeout=120).json()
    # completion.ts getComplFromContent, statusbar.ts showInfo:
    assert "content" in data and isinstance(data["content"], str)
    assert isinstance(data["generation_settings"]["n_ctx"], int) and data["generation_settings"]["n_ctx"] == 4096
    t = data["timings"]
    for key in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert isinstance(t[key], (int, float)), key
    assert isinstance(data["tokens_cached"], int) and data["stop_type"] in ("eos", "limit", "word")
    # n_indent 4: the completion ends before a line that leaves the function's block.
    lines = data["content"].split("\n")
    assert all(not line.strip() or line.startswith("    ") for line in lines[1:]), data["content"]
    assert httpx.get(url + "/props").json()["default_generation_settings"]["n_ctx"] == 4096
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    n = len(httpx.post(url + "/tokenize", json={"content": "def f():", "add_special": False,
                                                "parse_special": True}).json()["tokens"])
    assert n > 0


def test_infill_on_a_model_without_fim_tokens_is_501(smol):
    r = httpx.post(smol[0] + "/infill", json=VIM_FIM, timeout=60)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert "Infill is not supported by this model" in r.json()["error"]["message"]


def test_a_client_that_leaves_mid_stream_then_the_same_request(smol, reference):
    body = {"prompt": "Once upon a time,", "n_predict": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", smol[0] + "/completion", json=body, timeout=120) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 6:
                break
    r = httpx.post(smol[0] + "/completion", json=body | {"stream": False}, timeout=120)
    assert same_or_tie(reference, body["prompt"], 200, r.json()["content"])


def test_eight_clients_at_once(smol, reference):
    prompts = [f"Write one sentence about the number {i}." for i in range(8)]
    expected = {p: plain(reference, messages=[{"role": "user", "content": p}], max_tokens=24) for p in prompts}
    got: dict[str, str] = {}

    def ask(p: str) -> None:
        r = httpx.post(smol[0] + "/v1/chat/completions", timeout=300,
                       json={"messages": [{"role": "user", "content": p}], "max_tokens": 24, "temperature": 0})
        got[p] = r.json()["choices"][0]["message"]["content"]
    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


BAD = [  # (method, path, body or raw bytes, status, words in the message)
    ("POST", "/completion", b"{not json", 400, "body: not valid JSON"),
    ("POST", "/completion", b'{"prompt": "\xff\xfe"}', 400, ""),
    ("POST", "/completion", {"prompt": "hi", "n_predict": "many"}, 400, "n_predict"),
    ("POST", "/completion", {"prompt": "hi", "n_predict": -5}, 400, "n_predict"),
    ("POST", "/completion", {"prompt": "hi", "n_predict": 10**12}, 400, "n_predict"),
    ("POST", "/completion", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("POST", "/completion", {"prompt": "hi", "top_p": 7}, 400, "top_p"),
    # found by the fuzzer: a penalty of 0 divided logits by zero and took the server down
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user"}], "repeat_penalty": 0.0, "top_k": 0},
     400, "repeat_penalty"),
    ("POST", "/completion", {"prompt": [1, -3]}, 400, "prompt.1: Input should be greater than or equal to 0"),
    ("POST", "/completion", {"prompt": [10**9]}, 400, "outside the vocabulary"),
    ("POST", "/completion", {"prompt": ""}, 400, "empty"),
    ("POST", "/completion", {"prompt": "word " * 3000}, 400, "exceeds the available context size"),
    ("POST", "/completion", {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("POST", "/infill", {"input_suffix": ""}, 400, "input_prefix"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "n": 2}, 400, "n"),
    ("POST", "/v1/completions", {"prompt": "x", "echo": True}, 400, "echo"),
    ("POST", "/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("POST", "/completion", {"prompt": "x", "n_probs": 99}, 400, "n_probs"),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs needs logprobs"),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs"),
    ("POST", "/detokenize", {"tokens": [10**9]}, 400, "outside the vocabulary"),
    ("POST", "/completion", {"prompt": "hi", "drafter": "warp@3"}, 400, "unknown drafter 'warp'"),
    # a request never loads a drafter: one the server has not loaded is refused at once
    ("POST", "/v1/chat/completions", {"messages": CHAT, "drafter": "draft"}, 400, "not loaded on this server"),
    ("POST", "/completion", b"[" * 100000 + b"]" * 100000, 400, ""),
    # an image where only text is read: the part's type, not "content should be a string"
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, 400, "messages.0.content.0.type"),
    # output of a shape is refused, not answered in free text the client cannot parse
    ("POST", "/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, 400,
     "response_format.type: json_object not supported"),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]},
     400, "tools: not supported (tool calls)"),
    ("POST", "/completion", {"prompt": "hi", "grammar": 'root ::= "a"'}, 400, "grammar: not supported (constrained output)"),
    ("POST", "/completion", {"prompt": "hi", "json_schema": {"type": "object"}}, 400, "json_schema: not supported"),
    ("GET", "/nowhere", None, 404, "File Not Found"),
    ("GET", "/completion", None, 405, ""),
    ("POST", "/completion", b'{"prompt": "' + b"a" * (17 << 20) + b'"}', 413, "larger than"),
]


@pytest.mark.parametrize("method,path,body,status,words", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_are_4xx_with_a_clear_message(smol, method, path, body, status, words):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    r = httpx.request(method, smol[0] + path, timeout=60, headers={"Content-Type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and words in err["message"] and err["type"]


def test_a_request_names_a_drafter_the_server_has(smol, reference):
    """auto's members (the suffix drafter, the Jakiro drafter that ships for SmolLM2), lookup and
    plain decoding, each at a static K or chosen by auto over a few: the engine's greedy text."""
    text = "The capital of France is"
    expected = plain(reference, prompt=text, max_tokens=24)
    for name in ("none", "lookup@2", "suffix", "jakiro", "auto:suffix+lookup"):
        r = httpx.post(smol[0] + "/completion", json={"prompt": text, "n_predict": 24, "temperature": 0,
                                                      "drafter": name}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["content"] == expected and r.json()["generation_settings"]["speculative"] == name


def test_the_server_still_answers_after_bad_requests(smol):
    r = httpx.post(smol[0] + "/completion", json={"prompt": "Hello", "n_predict": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    # `curl -d '{...}'` says the body is a form: it is JSON all the same, as llama-server takes it.
    r = httpx.post(smol[0] + "/completion", content=b'{"prompt": "Hello", "n_predict": 2}',
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def test_api_key_and_hosts(small_path):
    r = subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "-m", str(small_path), "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--api-key" in r.stderr.strip().splitlines()[-1]
    with serving(small_path, "--api-key", "s3cret") as (url, _):
        assert httpx.get(url + "/health").status_code == 200  # public
        assert httpx.get(url + "/v1/models").status_code == 200
        r = httpx.post(url + "/completion", json={"prompt": "hi", "n_predict": 2})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert json.loads(vim_post(url + "/completion", {"prompt": "hi", "n_predict": 2}))["error"]["code"] == 401
        assert httpx.post(url + "/completion", json={"prompt": "hi", "n_predict": 2},
                          headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_a_port_taken_or_out_of_range_is_one_line_before_the_model_loads(small_path):
    import socket

    def serve(*args):
        return subprocess.run([sys.executable, "-m", "localspec.cli", "serve", "-m", str(small_path), *args],
                              capture_output=True, text=True, timeout=60)
    with socket.create_server(("127.0.0.1", 0)) as taken:  # another server listens there
        r = serve("--port", str(taken.getsockname()[1]))
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].endswith(
        "Address already in use (another server? --port picks another)"), r.stderr
    assert "on the CPU" not in r.stderr  # no model was loaded for nothing
    r = serve("--port", "70000")
    assert r.returncode == 2 and r.stderr.strip().endswith("argument --port: a port is 0 to 65535, not 70000")
    if socket.has_ipv6:  # the loopback's IPv6 name binds as IPv6 (the check first refused it)
        from localspec.cli import check_port_free
        check_port_free("::1", 0)


def test_a_server_stopped_by_sigterm_closes_as_after_ctrl_c(small_path, tmp_path):
    """A service manager's stop (SIGTERM) shuts down gracefully and closes the engine: the
    suffix store's index is saved beside its log, and the exit is 0."""
    with serving(small_path, env={"LOCALSPEC_SUFFIX_DIR": str(tmp_path)}) as (url, proc):
        r = httpx.post(url + "/completion", json={"prompt": "def add(a, b):", "n_predict": 8}, timeout=60)
        assert r.status_code == 200
        proc.terminate()
        assert proc.wait(30) == 0
    (store,) = tmp_path.iterdir()
    assert (store / "answers.log").stat().st_size > 60 and (store / "index.bin").exists()  # the answer, its index


def test_a_model_that_cannot_load_is_said_in_the_terminal_and_to_every_request(small_path):
    """The server stays up and answers 503 with why (an editor shows it); the person who
    started it reads the same line where they started it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localspec.cli", "serve", "-m", str(small_path), "--port", str(port),
                             "--ctx", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while "error" not in line:
            line = proc.stdout.readline()
            assert line, "the server ended without a word"
        assert line.startswith("localspec: error: a context of 8 tokens is too small"), line
        deadline = time.monotonic() + 60
        while True:  # the load may fail before the server listens
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.2)
        assert r.status_code == 503 and "too small" in r.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_fuzzing_from_the_schema_finds_no_5xx(smol):
    """Schemathesis generates bodies from the server's OpenAPI schema (bounded in time); every
    answer is below 500 and the server keeps answering."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(smol[0] + "/openapi.json")
    failures = []
    deadline = time.monotonic() + 14  # of the suite's 25 minutes on two cores
    for op in schema.get_all_operations():
        if time.monotonic() > deadline:
            break
        operation = op.ok()

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def check(case):
            if time.monotonic() > deadline:
                return
            if isinstance(case.body, dict):  # short answers: the time goes to many requests
                limits = [k for k in ("n_predict", "max_tokens", "max_completion_tokens")
                          if isinstance(case.body.get(k), int)]
                for key in limits:
                    case.body[key] = max(1, min(case.body[key], 8))
                if not limits:  # none: until the context's end, over a minute on a slow machine
                    case.body["max_tokens" if case.path.startswith("/v1") else "n_predict"] = 8
            response = case.call(timeout=60)
            if response.status_code >= 500 and response.status_code != 501:  # 501: no FIM tokens
                failures.append((case.method, case.path, case.body, response.status_code, response.text[:200]))
        check()
    assert not failures, failures[:3]
    assert httpx.get(smol[0] + "/health").status_code == 200


def test_memory_stays_flat_over_a_hundred_and_forty_requests(smol):
    url, proc = smol
    rng = random.Random(1)

    def rss() -> int:
        with open(f"/proc/{proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    sizes = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(140):
            kind = rng.choice(["completion", "chat", "tokenize"])
            common = {"temperature": rng.choice([0, 0.7, 1.2]), "seed": rng.randrange(1 << 30),
                      "top_k": rng.choice([0, 20, 40])}
            if kind == "completion":
                r = client.post("/completion", json={"prompt": f"Item {i}:", "n_predict": rng.randrange(1, 6), **common})
            elif kind == "chat":
                # A short system message: SmolLM2's default one would double the time to read
                # the prompt, which is not what this test measures.
                messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}"}]
                r = client.post("/v1/chat/completions", json={"messages": messages,
                                                              "max_tokens": rng.randrange(1, 6), **common})
            else:
                r = client.post("/tokenize", json={"content": "hello " * rng.randrange(1, 50)})
            assert r.status_code == 200, r.text
            if i in (69, 139):  # warmed up, then 70 requests later
                sizes.append(rss())
    assert sizes[1] <= sizes[0] * 1.05, sizes
