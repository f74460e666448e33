"""The data one request carries through the layers, and the snapshots operators read.

At the bottom of the import graph (with media_types.py and tool_types.py): the API edge, the
pipeline, the engine and observability can all speak of the same things without importing each
other. Everything here is a frozen dataclass except ``MediaStats``, which the media stage counts
into (snapshots are copies).

    api/validation ─▶ GenerationRequest (Sampling, ChatTurn, ImageInput)
    pipeline       ─▶ RenderedPrompt, EngineImages, LookupReport, ImageReport ─▶ Finished
                   ─▶ EngineRequest ─▶ engine
    engine         ─▶ EngineDelta ─▶ pipeline; EngineTimes (once, at the end) ─▶ EngineTrace
    engine, media  ─▶ EngineStats, EngineTokenStats, AdapterStats, MediaStats ─▶ metrics, GetStats
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, final

# a request's videos and the media stage's counts (services/media_types.py), and a chat's tools
# (services/tool_types.py), re-exported with the request they travel in
from .media_types import EngineVideos, MediaStats, VideoInput, VideoReport
from .tool_types import ToolCall, Tools

CachePolicy = Literal["prompt", "response", "bypass"]
MediaForm = Literal["embeddings", "pixels"]
ConstraintKind = Literal["json_schema", "regex", "grammar", "choice", "json_object"]


# ── a validated request ─────────────────────────────────────────────────────────────────────


@final
@dataclass(frozen=True, slots=True)
class Constraint:
    """The form the output must take: ``text`` is the JSON schema (compact JSON), regex or
    grammar; ``choices`` the strings of a choice; json_object has neither."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class Sampling:
    """Validated sampling settings; None leaves the engine's default."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    ignore_eos: bool = False
    stream_interval: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # (token id, bias), by token id: a tuple, so that two equal biases make one key
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: Constraint | None = None
    # samples of the prompt (with a seed, sample i is drawn with seed + i)
    n: int = 1
    # alternatives reported per output token, per prompt token (None: no log-probabilities)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    @property
    def deterministic(self) -> bool:
        """Greedy, or seeded: the same prompt gives the same tokens."""
        return self.temperature == 0.0 or self.seed is not None


@final
@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: str
    content: str
    tool_call_id: str = ""  # a "tool" turn: the call it answers
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls


@final
@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a request: its bytes, or (``data`` None) the digest of bytes sent earlier,
    or the URL mmgate fetches them from."""

    index: int
    data: bytes | None
    digest: str = ""
    mime_type: str = ""
    url: str = ""


@final
@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A request that passed validation; ``max_tokens_set`` False: "what the context allows".

    One of ``prompt``, ``chat`` and ``token_ids`` is set: the input the caller chose."""

    prompt: str | None
    chat: tuple[ChatTurn, ...] | None
    sampling: Sampling
    max_tokens_set: bool
    request_id: str
    cache_policy: CachePolicy
    images: tuple[ImageInput, ...] = ()
    # keep only the rendered prompt's last this many tokens (None: all of them)
    truncate_prompt_tokens: int | None = None
    # a prompt the caller tokenized: neither rendered nor tokenized here
    token_ids: tuple[int, ...] | None = None
    # a chat's tools (None: the chat has none, or the input is no chat)
    tools: Tools | None = None
    # with a reasoning parser: the model's thinking handed out apart (False: left out)
    include_reasoning: bool = True
    videos: tuple[VideoInput, ...] = ()

    @property
    def input_field(self) -> str:
        """The field of the request's input, as a refusal names it."""
        if self.chat is not None:
            return "chat"
        return "prompt" if self.token_ids is None else "token_ids.ids"


# ── what the pipeline makes of it ───────────────────────────────────────────────────────────


@final
@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    token_ids: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        # what the cache actor weighs: a Python int in a tuple is ~36 bytes
        return len(self.text) + 36 * len(self.token_ids)


@final
@dataclass(frozen=True, slots=True)
class EngineImages:
    """A request's images as the engine takes them, with their identities for vLLM's caches
    (each image's digest, salted per tenant: pipeline/tenancy.py)."""

    form: MediaForm
    items: tuple[Any, ...]
    uuids: tuple[str, ...]


@final
@dataclass(frozen=True, slots=True)
class AdapterRef:
    """A LoRA adapter as the engine serves it: its name, and its content digest (a reload under
    the same name with other weights is another adapter, in every cache)."""

    name: str
    digest: str
    rank: int = 0


@final
@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One run of the engine: a tokenized prompt, its sampling and images, under mmgate's id.

    ``request_id`` is mmgate's own and unique: two callers that send the same id never share (or
    abort) each other's engine request. ``label`` is the caller's id, for spans and logs only.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: Sampling
    images: EngineImages | None = None
    videos: EngineVideos | None = None
    # W3C trace context for vLLM's own spans (traceparent, tracestate)
    trace_headers: Mapping[str, str] | None = None
    label: str = ""
    # the tenant's salt of the engine's prefix cache (pipeline/tenancy.py); None: shared
    cache_salt: str | None = None
    # one output per sample when it has ended, none at each step (a unary call's own run)
    final_only: bool = False
    # the LoRA adapter to answer through; None: the base model
    adapter: AdapterRef | None = None
    # lower is more urgent: the order within a tenant in mmgate's queue, and vLLM's
    priority: int = 0


@final
@dataclass(frozen=True, slots=True)
class ImageReport:
    """Where one image came from: ``outcome`` hit | miss | coalesced | bypass (computed without
    the cache: degraded mode), ``tier`` "" when computed."""

    digest: str
    outcome: str
    tier: str
    form: MediaForm


@final
@dataclass(frozen=True, slots=True)
class LookupReport:
    """One cache stage of a request: ``outcome`` hit | miss | coalesced | bypass; ``reason``
    why a bypass: policy (the request's cache_policy), cache_dead, cache_stalled."""

    stage: str
    key: str
    outcome: str
    tier: str
    wait_ms: float
    reason: str = ""


@final
@dataclass(frozen=True, slots=True)
class EngineTimes:
    """vLLM's own timestamps of a request (the engine core's monotonic clock, seconds)."""

    queued: float
    scheduled: float
    first_token: float
    last_token: float
    preemptions: int


@final
@dataclass(frozen=True, slots=True)
class Logprob:
    """A token's log-probability (natural log), with the token's text alone."""

    token_id: int
    logprob: float
    text: str


@final
@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position: the token there, and the most likely tokens, most likely first."""

    token: Logprob
    top: tuple[Logprob, ...]


@final
@dataclass(frozen=True, slots=True)
class EngineDelta:
    """New tokens of one sample of a request; ``finish_reason`` is set on the sample's last."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    # the prompt as the engine ran it: each image placeholder expanded to the image's tokens
    prompt_tokens: int = 0
    index: int = 0  # the sample
    # the model's thinking in this delta, with a reasoning parser (``text``: the answer's)
    reasoning: str = ""
    # calls of the sample's completed with this delta, each whole and checked
    tool_calls: tuple[ToolCall, ...] = ()
    # one per token id, when the request asked for log-probabilities
    logprobs: tuple[TokenLogprobs, ...] = ()
    # the stop string or stop token id that ended the sample (None: any other end)
    stop_reason: str | int | None = None
    # the prompt's (every token after the first), on the first delta that has them
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class SampleEnd:
    """How one sample ended: ``finish_reason`` None when it did not (the run was cut)."""

    index: int
    finish_reason: str | None
    stop_reason: str | int | None
    completion_tokens: int
    # with tools: the calls read from the sample's text, the text outside them, and why output
    # that looked like calls was handed back as text
    tool_calls: tuple[ToolCall, ...] = ()
    content: str | None = None
    tool_parse_error: str = ""


@final
@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a request's stream: what GenerateFinal reports."""

    request_id: str
    model: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    response_from_cache: bool
    lookups: tuple[LookupReport, ...]
    images: tuple[ImageReport, ...]
    samples: tuple[SampleEnd, ...] = ()
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    adapter: AdapterRef | None = None
    # how long the request waited in mmgate's queue for an engine slot, and at what priority
    queue_ms: float = 0.0
    videos: tuple[VideoReport, ...] = ()
    priority: int = 0


# ── snapshots ───────────────────────────────────────────────────────────────────────────────

# Upper bounds of the time-to-first-token buckets, in seconds (the histogram's `le`).
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0
)  # fmt: skip


@final
@dataclass(frozen=True, slots=True)
class EngineStats:
    prefix_cache_queries: int
    prefix_cache_hits: int
    requests: int
    requests_with_cached_prefix: int
    aborted: int
    running: int
    waiting: int
    kv_cache_usage: float

    @property
    def prefix_cache_hit_ratio(self) -> float:
        queries = self.prefix_cache_queries
        return self.prefix_cache_hits / queries if queries else 0.0


EngineState = Literal["starting", "serving", "stalled", "hung", "failed", "stopped"]


@final
@dataclass(frozen=True, slots=True)
class EngineHealth:
    """The engine as the watchdog sees it, from mmgate's own bookkeeping (true when the engine
    has gone silent); see services/engine/progress.py."""

    state: EngineState
    in_flight: int
    seconds_since_step: float
    stalls: int


@final
@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a started engine's model is, for callers (Inference.GetModelInfo)."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    has_chat_template: bool
    structured_output_backend: str = "auto"
    template_takes_tools: bool = False  # the chat template renders a chat's tools


@final
@dataclass(frozen=True, slots=True)
class EngineTokenStats:
    """Tokens the engine has processed since start, and how soon requests got their first."""

    prompt_tokens: int
    generation_tokens: int
    # over the last few seconds (0 once the engine has been idle that long)
    generation_tokens_per_second: float
    # requests per bucket of TIME_TO_FIRST_TOKEN_BUCKETS, then beyond the last (not cumulative)
    time_to_first_token_counts: tuple[int, ...]
    time_to_first_token_sum: float


@final
@dataclass(frozen=True, slots=True)
class AdapterStats:
    """Requests and generated tokens by adapter ("base": none), and what the engine holds."""

    requests: Mapping[str, int] = field(default_factory=dict)
    generated_tokens: Mapping[str, int] = field(default_factory=dict)
    served: int = 0  # adapters a request may name now
    loads: Mapping[str, int] = field(default_factory=dict)  # run-time loads by outcome
    running: tuple[str, ...] = ()  # adapters with runs in the engine now, by name
    max_loras: int = 0  # adapters in one engine step at most (0: no adapters)


@final
@dataclass(frozen=True, slots=True)
class ThreadPoolStats:
    """One kind of CPU-bound work's thread pool (services/pipeline/threads.py)."""

    pool: str
    threads: int  # its capacity
    busy: int  # computations running now
    waiting: int  # computations queued for a thread


__all__ = [
    "TIME_TO_FIRST_TOKEN_BUCKETS",
    "AdapterRef",
    "AdapterStats",
    "CachePolicy",
    "ChatTurn",
    "Constraint",
    "ConstraintKind",
    "EngineDelta",
    "EngineHealth",
    "EngineImages",
    "EngineRequest",
    "EngineState",
    "EngineStats",
    "EngineTimes",
    "EngineTokenStats",
    "EngineVideos",
    "Finished",
    "GenerationRequest",
    "ImageInput",
    "ImageReport",
    "Logprob",
    "LookupReport",
    "MediaForm",
    "MediaStats",
    "ModelFacts",
    "RenderedPrompt",
    "SampleEnd",
    "Sampling",
    "ThreadPoolStats",
    "TokenLogprobs",
    "ToolCall",
    "Tools",
    "VideoInput",
    "VideoReport",
]
