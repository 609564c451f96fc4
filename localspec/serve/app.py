"""`localspec serve`: llama-server's endpoints for editors (/infill, /completion, /tokenize, ...)
and OpenAI's for chat clients (/v1/chat/completions, /v1/completions, /v1/models), over one
engine owned by one worker thread. Bodies and errors are shaped as llama-server's, in compact
one-line JSON (llama.vim looks for `"content":"`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable, Iterable, Iterator

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response, StreamingResponse

from localspec import __version__
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Delta, Done, Engine, Reason, Request
from localspec.errors import LocalspecError
from localspec.loop import Stats
from localspec.sampling import SamplingConfig, TokenLogprob
from localspec.serve import schema
from localspec.serve.infill import INFILL_BATCH, INFILL_PREDICT, ExtraChunk, infill_tokens, missing_fim_tokens
from localspec.worker import END, Job, Worker

PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}  # open even with an API key
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


@dataclass(frozen=True)
class ServeConfig:
    api_key: str | None = None
    max_body: int = 16 << 20  # bytes
    infill_predict: int = INFILL_PREDICT
    infill_batch: int = INFILL_BATCH


class APIError(Exception):
    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class JSON(Response):
    """One compact line, UTF-8 as it is."""
    media_type = "application/json"

    def render(self, content) -> bytes:
        return dumps(content).encode("utf-8")


def error(status: int, message: str, **extra) -> JSON:
    return JSON({"error": {"code": status, "message": message, "type": ERROR_TYPES.get(status, "server_error"),
                           **extra}}, status_code=status)


def sse(events: AsyncIterator[dict | str]) -> StreamingResponse:
    async def body():
        async for event in events:
            yield f"data: {event if isinstance(event, str) else dumps(event)}\n\n"
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class Guard:
    """Before any route: the API key (if one is set), the body's size (as it arrives, whatever
    the headers say), and 503 while the model loads. Plain ASGI, so that streams and the
    client's disconnect pass through untouched."""

    def __init__(self, app, worker: Worker, cfg: ServeConfig):
        self.app, self.worker, self.cfg = app, worker, cfg

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, headers = scope["path"], dict(scope["headers"])
        if self.cfg.api_key and path not in PUBLIC:
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not given.startswith("Bearer ") or given[len("Bearer "):] != self.cfg.api_key:
                return await error(401, "Invalid API Key")(scope, receive, send)
        if path not in PUBLIC and not self.worker.ready:
            return await error(503, self.worker.error or "Loading model")(scope, receive, send)
        size = headers.get(b"content-length", b"")
        if size.isdigit() and int(size) > self.cfg.max_body:
            return await error(413, f"request body larger than {self.cfg.max_body} bytes")(scope, receive, send)
        if scope["method"] == "POST":  # every body is JSON, whatever curl -d says (llama-server too)
            scope = dict(scope, headers=[(k, v) for k, v in scope["headers"] if k != b"content-type"]
                         + [(b"content-type", b"application/json")])
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.cfg.max_body:  # FastAPI passes HTTP exceptions through body parsing
                raise HTTPException(413, f"request body larger than {self.cfg.max_body} bytes")
            return message
        await self.app(scope, bounded, send)


def create_app(worker: Worker, cfg: ServeConfig = ServeConfig()) -> FastAPI:
    """The server over the engine `worker` runs: llama-server's endpoints (for editors) and
    OpenAI's, errors in llama-server's shape, the key and size checks in front (Guard)."""
    app = FastAPI(title="localspec", version=__version__, docs_url=None, redoc_url=None)
    app.state.worker = worker

    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        return error(e.status, e.message, **e.extra)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, e: RequestValidationError):
        return error(400, validation_message(e.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(_, e: HTTPException):
        return error(e.status_code, "File Not Found" if e.status_code == 404 else str(e.detail))

    app.add_middleware(Guard, worker=worker, cfg=cfg)
    add_small_routes(app, worker)
    add_llama_routes(app, worker, cfg)
    add_openai_routes(app, worker)
    return app


def validation_message(errors) -> str:
    """One line for what is wrong with a body: where, and why. Of a field that may be one of
    several types (a prompt's text or token ids), each type's failure comes back; the one
    that went deepest into the value says most (a negative token id, not "should be a
    string"), and the types' tags ("list[constrained-int]") are no part of where it is."""
    if not errors:
        return "body: invalid request"
    first = max(errors, key=lambda err: len(err.get("loc", ())))  # the first of the deepest
    if first.get("type") == "json_invalid":
        return f"body: not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})"
    where = ".".join(str(x) for x in first.get("loc", ())[1:] if not _type_tag(x)) or "body"
    return f"{where}: {first.get('msg', 'invalid request').removeprefix('Value error, ')}"


def _type_tag(part) -> bool:
    return isinstance(part, str) and ("[" in part or "-" in part or part in ("str", "int", "list"))


def engine_of(worker: Worker) -> Engine:
    """The worker's engine, or a 503 with why there is none (loading, or it failed)."""
    if worker.engine is None:
        raise APIError(503, worker.error or "Loading model")
    return worker.engine


def add_small_routes(app: FastAPI, worker: Worker) -> None:
    """Health, properties, models, tokenizing."""

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        if not worker.ready:
            return error(503, worker.error or "Loading model")
        return JSON({"status": "ok"})

    @app.get("/props")
    async def props():
        e = engine_of(worker)
        return JSON({"default_generation_settings": {"n_ctx": e.ctx.n_ctx, "params": defaults(e)},
                     "total_slots": 1, "model_alias": model_name(e), "model_path": e.model.path.name,
                     "chat_template": e.model.chat_template or "", "modalities": {"vision": False, "audio": False},
                     "build_info": f"localspec-{__version__}", "drafter": str(e.cfg.drafter)})

    @app.get("/models")
    @app.get("/v1/models")
    async def models():
        e = worker.engine
        if e is None:
            return JSON({"object": "list", "data": []})
        return JSON({"object": "list", "data": [{
            "id": model_name(e), "object": "model", "created": int(e.model.path.stat().st_mtime),
            "owned_by": "llamacpp", "meta": {"n_vocab": e.model.n_vocab, "n_ctx": e.ctx.n_ctx,
                                             "n_embd": e.model.n_embd, "size": e.model.path.stat().st_size}}]})

    @app.post("/tokenize")
    async def tokenize(body: schema.TokenizeBody):
        m = engine_of(worker).model
        tokens = m.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
        if not body.with_pieces:
            return JSON({"tokens": tokens})
        pieces = []
        for t in tokens:
            raw = m.token_bytes(t, special=True)
            try:
                pieces.append({"id": t, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:
                pieces.append({"id": t, "piece": list(raw)})
        return JSON({"tokens": pieces})

    @app.post("/detokenize")
    async def detokenize(body: schema.DetokenizeBody):
        m = engine_of(worker).model
        bad = [t for t in body.tokens if t >= m.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary ({m.n_vocab} tokens)")
        return JSON({"content": m.detokenize(body.tokens, special=True)})


def add_llama_routes(app: FastAPI, worker: Worker, cfg: ServeConfig) -> None:
    """llama-server's completion and infill, in its request and answer shapes."""

    @app.post("/completion")
    @app.post("/completions")
    async def completion(body: schema.CompletionBody, http: HTTPRequest):
        e = engine_of(worker)
        tokens = e.model.tokenize(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        return await llama_answer(worker, e, tokens, body, http, default_temperature=0.8)

    @app.post("/infill")
    async def infill(body: schema.InfillBody, http: HTTPRequest):
        e = engine_of(worker)
        missing = missing_fim_tokens(e.model)
        if missing:
            raise APIError(501, f"Infill is not supported by this model: {missing}")
        extra = [ExtraChunk(c.filename, c.text) for c in body.input_extra]
        tokens = infill_tokens(e.model, body.input_prefix, body.input_suffix, body.prompt, extra,
                               cfg.infill_batch, e.ctx.n_ctx, cfg.infill_predict)
        # Editors want the model's most likely completion: greedy unless asked otherwise.
        return await llama_answer(worker, e, tokens, body, http, default_temperature=0.0)


async def llama_answer(worker: Worker, e: Engine, tokens: list[int], body: schema.Options, http: HTTPRequest,
                       default_temperature: float):
    """Run a llama-server request: one JSON body, or SSE chunks then the final one."""
    check_prompt(e, tokens)
    request = make_request(e, tokens, body, body.n_predict, default_temperature, body.n_probs or None)
    limits = Limits(body.n_indent, body.t_max_predict_ms)
    probs = (lambda lps: {"completion_probabilities": [token_logprob_json(e, lp, ids=True) for lp in lps]}
             ) if body.n_probs else (lambda lps: {})
    job = worker.submit(run_request(request, limits, warm=body.n_predict == 0))
    settings = {**defaults(e), **sampling_json(request.sampling), "n_predict": body.n_predict or -1,
                "n_ctx": e.ctx.n_ctx, "stream": body.stream, "stop": list(request.stop),
                "speculative": str(request.drafter or e.cfg.drafter)}

    def final(text: str, done: Done | None, lps: tuple[TokenLogprob, ...] = ()) -> dict:
        stats = done.stats if done else Stats()
        reason, word = stop_type(done, limits)
        res = {"index": 0, "content": text, "tokens": [], "id_slot": 0, "stop": True,
               "model": model_name(e), "tokens_predicted": stats.predicted_n,
               "tokens_evaluated": len(tokens), "generation_settings": settings,
               "prompt": "", "has_new_line": "\n" in text, "truncated": False,
               "stop_type": reason, "stopping_word": word, "tokens_cached": done.cached if done else 0,
               "timings": timings(stats), **probs(lps)}
        return pick(res, body.response_fields)

    if body.stream:
        async def events():
            async for event in follow(job, http):
                if isinstance(event, Done):
                    yield final("", event)
                elif event.text or event.logprobs:
                    yield {"index": 0, "content": event.text, "tokens": [], "stop": False, "id_slot": 0,
                           "tokens_predicted": 0, "tokens_evaluated": len(tokens), **probs(event.logprobs)}
        return sse(events())
    text, done, lps = await gather(job, http)
    return JSON(final(text, done, lps))


def add_openai_routes(app: FastAPI, worker: Worker) -> None:
    """OpenAI's chat and text completions."""

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat(body: schema.ChatBody, http: HTTPRequest):
        e = engine_of(worker)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        try:
            tokens = e.prompt_tokens(Request(messages=messages))
        except LocalspecError as x:
            raise APIError(400, str(x)) from None
        return await openai_answer(worker, e, tokens, body, http, chat=True)

    @app.post("/v1/completions")
    async def openai_completion(body: schema.OpenAICompletionBody, http: HTTPRequest):
        e = engine_of(worker)
        tokens = e.model.tokenize(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        return await openai_answer(worker, e, tokens, body, http, chat=False)


async def openai_answer(worker: Worker, e: Engine, tokens: list[int], body: schema.OpenAIOptions,
                        http: HTTPRequest, chat: bool):
    """Run an OpenAI request: one JSON body, or SSE chunks (the role first, the usage where
    asked) then [DONE]."""
    check_prompt(e, tokens)
    k = body.logprob_alternatives()
    if isinstance(body, schema.ChatBody) and body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true")
    request = make_request(e, tokens, body, body.limit(), default_temperature=0.8, logprobs=k)
    job = worker.submit(run_request(request, Limits(body.n_indent, body.t_max_predict_ms), warm=False))
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    common = {"created": int(time.time()), "model": model_name(e), "system_fingerprint": f"localspec-{__version__}",
              "id": ident}
    kind = "chat.completion" if chat else "text_completion"

    def usage(stats: Stats) -> dict:
        return {"completion_tokens": stats.predicted_n, "prompt_tokens": len(tokens),
                "total_tokens": stats.predicted_n + len(tokens)}

    offset = 0  # where the next token's text starts (text_offset): its tokens' texts so far

    def choice(text: str | None, finish: str | None, final: bool = False,
               lps: tuple[TokenLogprob, ...] = ()) -> dict:
        nonlocal offset
        if not chat:
            logprobs = completion_logprobs(e, lps, offset) if k is not None else None
            if lps:
                offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
            return {"text": text or "", "index": 0, "logprobs": logprobs, "finish_reason": finish}
        if final and not body.stream:
            out = {"finish_reason": finish, "index": 0, "message": {"role": "assistant", "content": text}}
        else:
            out = {"finish_reason": finish, "index": 0, "delta": {} if text is None else {"content": text}}
        return out | ({"logprobs": {"content": [token_logprob_json(e, lp) for lp in lps]}} if k is not None else {})

    if body.stream:
        async def events():
            if chat:  # the role first, with empty content (not null)
                yield {"choices": [{"finish_reason": None, "index": 0,
                                    "delta": {"role": "assistant", "content": ""}}],
                       **common, "object": "chat.completion.chunk"}
            async for event in follow(job, http):
                if isinstance(event, Done):
                    stats = event.stats
                    last = {"choices": [choice(None if chat else "", finish_reason(event))], **common,
                            "object": kind + ".chunk" if chat else kind}
                    include = body.stream_options is not None and body.stream_options.include_usage
                    if not chat or not include:
                        last |= {"usage": usage(stats)} if not chat else {}
                        yield last | {"timings": timings(stats)}
                    else:
                        yield last
                        yield {"choices": [], **common, "object": kind + ".chunk",
                               "usage": usage(stats), "timings": timings(stats)}
                elif event.text or event.logprobs:
                    yield {"choices": [choice(event.text, None, lps=event.logprobs)], **common,
                           "object": kind + ".chunk" if chat else kind}
            yield "[DONE]"
        return sse(events())
    text, done, lps = await gather(job, http)
    stats = done.stats if done else Stats()
    return JSON({"choices": [choice(text, finish_reason(done), final=True, lps=lps)], **common, "object": kind,
                 "usage": usage(stats), "timings": timings(stats)})


# --- requests to the engine --------------------------------------------------------------------


def check_prompt(e: Engine, tokens: list[int]) -> None:
    if not tokens:
        raise APIError(400, "the prompt is empty")
    bad = [t for t in tokens if t >= e.model.n_vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary ({e.model.n_vocab} tokens)")
    if len(tokens) >= e.ctx.n_ctx:
        raise APIError(400, f"request ({len(tokens)} tokens) exceeds the available context size "
                            f"({e.ctx.n_ctx} tokens), try increasing it",
                       n_prompt_tokens=len(tokens), n_ctx=e.ctx.n_ctx)


def make_request(e: Engine, tokens: list[int], o: schema.Options, n_predict: int | None,
                 default_temperature: float, logprobs: int | None = None) -> Request:
    d = SamplingConfig()
    sampling = SamplingConfig(
        temperature=default_temperature if o.temperature is None else o.temperature,
        top_k=d.top_k if o.top_k is None else o.top_k, top_p=d.top_p if o.top_p is None else o.top_p,
        min_p=d.min_p if o.min_p is None else o.min_p,
        repeat_penalty=d.repeat_penalty if o.repeat_penalty is None else o.repeat_penalty,
        seed=o.seed, logprobs=logprobs)
    room = e.ctx.n_ctx - len(tokens) + 1
    limit = room if n_predict in (None, -1) else min(max(n_predict, 1), room)
    stops = (o.stop,) if isinstance(o.stop, str) else tuple(o.stop or ())
    return Request(prompt=tokens, sampling=sampling, max_tokens=limit, stop=tuple(s for s in stops if s),
                   drafter=drafter(e, o.drafter), cache=o.cache_prompt)


def drafter(e: Engine, name: str | None) -> DrafterSpec | None:
    """The drafter a request names, if the server has it loaded: a request never loads one."""
    if not name:
        return None
    try:
        spec = DrafterSpec.parse(name)
    except LocalspecError as x:
        raise APIError(400, str(x)) from None
    if not e.ready(spec):
        raise APIError(400, f"drafter '{spec}' is not loaded on this server (it runs '{e.cfg.drafter}' and what "
                            f"that loads, lookup and none): start it with --drafter {spec} to run it")
    return spec


class Limits:
    """Editors' limits on a completion, applied to its text as it comes: n_indent (stop before
    the first later line indented less: the completion has left the block) and t_max_predict_ms
    (past it, stop at the next newline, which is kept)."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: float | None = None):
        self.n_indent, self.t_max = n_indent, (t_max_predict_ms or 0) / 1e3
        self.start: float | None = None
        self.seen_newline = self.line_start = False
        self.indent = 0
        self.hit = False

    def take(self, text: str) -> str:
        """The part of `text` to keep; sets `hit` when the completion must end."""
        if self.start is None:
            self.start = time.perf_counter()
        for i, ch in enumerate(text):
            if ch == "\n":
                if self.t_max > 0 and time.perf_counter() - self.start > self.t_max:
                    self.hit = True
                    return text[:i + 1]
                self.seen_newline = self.line_start = True
                self.indent = 0
            elif self.line_start and ch in " \t":
                self.indent += 1
            elif self.line_start:
                self.line_start = False
                if self.n_indent and self.seen_newline and self.indent < self.n_indent:
                    self.hit = True
                    return text[:i]
        return text


def run_request(request: Request, limits: Limits, warm: bool) -> Callable[[Engine, threading.Event], Iterable]:
    """The worker's part: the engine's events, each Delta's text cut where an editor's limits
    end the completion. n_predict 0 only puts the prompt in the cache (an editor's warm-up)."""
    def run(e: Engine, cancel: threading.Event) -> Iterator[Delta | Done]:
        if warm:
            yield e.prefill(request)
            return
        for event in e.generate(request, cancel):
            if isinstance(event, Delta):
                if limits.hit:
                    continue
                kept = limits.take(event.text)
                if limits.hit:
                    cancel.set()
                if kept != event.text:
                    event = replace(event, pieces=((kept, None),))
            yield event
    return run


async def gather(job: Job, http: HTTPRequest) -> tuple[str, Done | None, tuple[TokenLogprob, ...]]:
    """A job's whole text, its end, and its tokens' log-probabilities where it asked, for an
    answer that is not streamed."""
    text, done, logprobs = "", None, ()
    async for event in follow(job, http):
        if isinstance(event, Done):
            done = event
        else:
            text += event.text
            logprobs += event.logprobs
    return text, done, logprobs


def token_logprob_json(e: Engine, lp: TokenLogprob, ids: bool = False) -> dict:
    """A token's log-probability as OpenAI's chat completions give it: its text, its bytes (a
    token may hold part of a character), and its likeliest alternatives'; with `ids` each
    token's id too (llama-server's completion_probabilities)."""
    def one(token: int, logprob: float) -> dict:
        raw = e.model.token_bytes(token)
        return ({"id": token} if ids else {}) | {"token": raw.decode("utf-8", errors="replace"),
                                                 "logprob": logprob, "bytes": list(raw)}
    return one(lp.token, lp.logprob) | {"top_logprobs": [one(t, p) for t, p in lp.top]}


def completion_logprobs(e: Engine, lps: tuple[TokenLogprob, ...], offset: int) -> dict:
    """Log-probabilities as OpenAI's text completions give them, each token's text starting
    `offset` characters into the completion onwards."""
    pieces = [e.model.detokenize([lp.token]) for lp in lps]
    starts = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=offset)) if pieces else []
    return {"tokens": pieces, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{e.model.detokenize([t]): p for t, p in lp.top} for lp in lps],
            "text_offset": starts}


async def follow(job: Job, http: HTTPRequest) -> AsyncIterator:
    """The job's items as they come; a client that goes away cancels it."""
    async def watch():
        while True:
            message = await http.receive()
            if message["type"] == "http.disconnect":
                job.cancel.set()
                return
    watcher = asyncio.create_task(watch())
    try:
        while (item := await job.out.get()) is not END:
            if isinstance(item, Exception):
                status = 400 if isinstance(item, LocalspecError) else 500
                raise APIError(status, str(item).splitlines()[0] if str(item) else type(item).__name__)
            yield item
    finally:
        job.cancel.set()  # a no-op once the job ended; stops it if the client left mid-stream
        watcher.cancel()


def stop_type(done: Done | None, limits: Limits) -> tuple[str, str]:
    if done is None:
        return "none", ""
    if limits.hit:
        return "limit", ""
    if done.reason is Reason.EOG:
        return "eos", ""
    if done.reason is Reason.STOP:
        return "word", done.stop
    return "limit", ""


def finish_reason(done: Done | None) -> str:
    return "stop" if done is None or done.reason.finished else "length"


def timings(s: Stats) -> dict:
    per = lambda ms, n: ms / n if n else None  # noqa: E731
    rate = lambda ms, n: n / ms * 1e3 if ms else None  # noqa: E731
    out = {"cache_n": s.cache_n, "prompt_n": s.prompt_n, "prompt_ms": s.prompt_ms,
           "prompt_per_token_ms": per(s.prompt_ms, s.prompt_n), "prompt_per_second": rate(s.prompt_ms, s.prompt_n),
           "predicted_n": s.predicted_n, "predicted_ms": s.predicted_ms,
           "predicted_per_token_ms": per(s.predicted_ms, s.predicted_n - 1),
           "predicted_per_second": s.predicted_per_second}
    if s.draft_n:
        out |= {"draft_n": s.draft_n, "draft_n_accepted": s.draft_n_accepted}
    return out


def pick(res: dict, fields: list[str] | None) -> dict:
    """llama-server's response_fields: each path (a/b) that exists, as a key of its own."""
    if not fields:
        return res
    out = {}
    for path in fields:
        value, ok = res, True
        for key in path.split("/"):
            if ok and isinstance(value, dict) and key in value:
                value = value[key]
            else:
                ok = False
        if ok:
            out[path] = value
    return out


def sampling_json(s: SamplingConfig) -> dict:
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
            "repeat_penalty": s.repeat_penalty, "seed": -1 if s.seed is None else s.seed}


def defaults(e: Engine) -> dict:
    return {**sampling_json(SamplingConfig(temperature=0.8)), "n_predict": -1, "n_ctx": e.ctx.n_ctx,
            "speculative": str(e.cfg.drafter)}


def model_name(e: Engine) -> str:
    return e.model.path.stem
