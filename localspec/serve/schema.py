"""The bodies the server accepts, with the fields real clients send (llama.vim, llama.vscode,
OpenAI clients) and bounds on every number. Fields a client sends that localspec does not use
are accepted and ignored, as llama-server ignores what it does not know; but a request for
output of a shape (a grammar, a JSON schema, JSON mode, tool calls) is refused: answering it
with free text would hand the client what it said it cannot parse."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from localspec.sampling import MAX_LOGPROBS

MAX_PREDICT = 32_768       # no request generates more than this (and never past the context)
MAX_TEXT = 4_000_000       # characters of any one text field (the body is bounded too)

Text = Annotated[str, Field(max_length=MAX_TEXT)]
FREE_TEXT = "localspec answers in free text"


def refused(*fields: str, what: str):
    """A validator refusing these fields unless empty: `what` is not supported."""
    def check(cls, value):
        if value:
            raise ValueError(f"not supported ({what}): {FREE_TEXT}")
        return value
    return field_validator(*fields)(classmethod(check))


class Options(BaseModel):
    """Sampling and stopping, under llama-server's names."""
    model_config = ConfigDict(extra="allow")

    temperature: float | None = Field(None, ge=0, le=10)
    top_k: int | None = Field(None, ge=0, le=100_000)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0, le=10)
    seed: int | None = Field(None, ge=-1, le=2**63 - 1)  # -1 or none: a random seed
    stop: Text | list[Text] | None = Field(None, max_length=16)
    n_predict: int | None = Field(None, ge=-1, le=MAX_PREDICT)  # -1: until the end or the context's
    stream: bool = False
    cache_prompt: bool = True
    samplers: list[str] | str | None = None   # accepted; the chain is penalties, top-k, top-p, min-p, T
    id_slot: int | None = None                # accepted; one slot
    model: str | None = None                  # accepted; the server's model answers
    t_max_prompt_ms: float | None = None      # accepted; as in llama-server, not applied
    t_max_predict_ms: float | None = Field(None, le=3_600_000)  # after this, stop at a newline
    n_indent: int = Field(0, ge=0, le=10_000)  # stop before a line indented less than this
    response_fields: list[str] | None = Field(None, max_length=64)
    n_probs: int = Field(0, ge=0, le=MAX_LOGPROBS)  # llama-server's: each token's log-probability and this many alternatives'
    drafter: str | None = Field(None, max_length=1000)  # localspec's: what drafts (one the server has loaded)
    grammar: str | None = None       # llama-server's constrained output: refused unless empty
    json_schema: dict | None = None  # ... and this
    _no_constraint = refused("grammar", "json_schema", what="constrained output")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"{value} not supported (type text only): {FREE_TEXT}")
        return value


class CompletionBody(Options):
    prompt: Text | list[Annotated[int, Field(ge=0)]] = ""


class ExtraChunkBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # llama.vim adds `time`
    text: Text
    filename: Text = ""


class InfillBody(Options):
    input_prefix: Text
    input_suffix: Text
    input_extra: list[ExtraChunkBody] = Field(default_factory=list, max_length=1024)
    prompt: Text = ""


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class OpenAIOptions(Options):
    max_tokens: int | None = Field(None, ge=1, le=MAX_PREDICT)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_PREDICT)
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)  # one choice per request
    response_format: ResponseFormat | None = None
    tools: list | None = None  # refused unless empty: no tool calls
    functions: list | None = None  # (their older name)
    _no_tools = refused("tools", "functions", what="tool calls")

    def limit(self) -> int | None:
        """How many tokens: n_predict wins, as in llama-server."""
        return self.n_predict if self.n_predict is not None else self.max_completion_tokens or self.max_tokens


class ChatBody(OpenAIOptions):
    messages: list[ChatMessage] = Field(min_length=1, max_length=10_000)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def logprob_alternatives(self) -> int | None:
        """Alternatives per token's log-probability; None: no log-probabilities."""
        return (self.top_logprobs or 0) if self.logprobs else None


class OpenAICompletionBody(OpenAIOptions):
    prompt: Text | list[Annotated[int, Field(ge=0)]]
    echo: Literal[False] = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def logprob_alternatives(self) -> int | None:
        return self.logprobs


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    content: Text = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    tokens: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=1_000_000)
