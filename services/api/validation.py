"""Request validation: everything that can be refused before any cache or engine work.

    pb.GenerateRequest ─ validate ─▶ GenerationRequest (services/types.py: no proto below here)
                                  └▶ InvalidRequest([Violation(field, description), ...])

Each problem becomes a ``google.rpc.BadRequest.FieldViolation`` naming the field, so a client can
point at its mistake; all problems of a request are reported together.
"""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from collections.abc import Callable, Sequence

from google.protobuf import unknown_fields
from google.protobuf.message import Message

from ..config import Settings
from ..errors import InvalidRequest, Violation
from ..media_types import VideoInput
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..tool_types import Tools
from ..types import CachePolicy, ChatTurn, Constraint, GenerationRequest, ImageInput, Sampling
from ..wire import IMAGE_PLACEHOLDER, MIME_TYPES
from .constraints import checked_constraint
from .media_inputs import checked_videos, media_source, url_violations
from .tools import checked_tools, tool_turn_fields

ROLES = frozenset({"system", "user", "assistant", "tool"})
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
MAX_STOP_CHARS = 256
# alternatives per token (SamplingParams.logprobs, prompt_logprobs): vLLM's default max_logprobs
MAX_LOGPROBS = 20
# token ids named one by one in a refusal: the rest are counted
_NAMED_IDS = 8
# problems listed in one refusal, and characters of a description: the rest are counted. A
# refusal never grows with what a caller sends (a million empty stop strings once made a 54 MB
# message, more than gRPC's trailers carry).
MAX_VIOLATIONS = 16
MAX_DESCRIPTION_CHARS = 200
_FORCED_CALLS = (
    "cannot be combined with chat.tool_choice required or a function: the calls' schema is"
    " the constraint then"
)


_POLICIES: dict[int, CachePolicy] = {
    pb.CACHE_POLICY_UNSPECIFIED: "prompt",
    pb.CACHE_POLICY_RESPONSE: "response",
    pb.CACHE_POLICY_BYPASS: "bypass",
}


def _bounded(description: str) -> str:
    if len(description) <= MAX_DESCRIPTION_CHARS:
        return description
    return description[: MAX_DESCRIPTION_CHARS - 1] + "…"


def _has_unknown_fields(message: Message) -> bool:
    return len(unknown_fields.UnknownFieldSet(message)) > 0


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def validate(
    request: pb.GenerateRequest,
    settings: Settings,
    *,
    max_model_len: int,
    vocab_size: int | None = None,
    takes_images: bool = False,
    takes_video: bool = False,
) -> GenerationRequest:
    """Check a GenerateRequest against the contract, the model and the server's limits
    (``vocab_size`` None: token ids are checked against no vocabulary)."""
    problems: list[Violation] = []
    unlisted = 0

    def bad(field: str, description: str) -> None:
        nonlocal unlisted
        if len(problems) < MAX_VIOLATIONS:
            problems.append(Violation(field, _bounded(description)))
        else:
            unlisted += 1

    size = request.ByteSize()
    if size > settings.max_message_bytes:
        bad("request", f"{size} bytes; the limit is {settings.max_message_bytes}")

    prompt: str | None = None
    chat: tuple[ChatTurn, ...] | None = None
    tools: Tools | None = None
    calls_constraint: Constraint | None = None
    token_ids: tuple[int, ...] | None = None
    kind = request.WhichOneof("input")
    if kind is None:
        bad("input", "set prompt, chat or token_ids")
    elif kind == "token_ids":
        token_ids = _token_ids(request.token_ids, max_model_len, vocab_size, bad)
    elif kind == "prompt":
        prompt = request.prompt
        if not prompt.strip():
            bad("prompt", "must not be empty")
        elif len(prompt) > settings.max_prompt_chars:
            bad("prompt", f"{len(prompt)} characters; the limit is {settings.max_prompt_chars}")
    else:
        messages = request.chat.messages
        if _has_unknown_fields(request.chat):
            bad("chat", "carries fields this server does not know")
        if not messages:
            bad("chat.messages", "must hold at least one message")
        elif len(messages) > settings.max_chat_messages:
            # refused before anything is read or built from the messages: a chat of 3 million
            # once held the event loop 6 s
            bad(
                "chat.messages",
                f"{len(messages)} messages; the limit is {settings.max_chat_messages}",
            )
        else:
            chat = _chat(messages, settings, bad)
        tools, calls_constraint = checked_tools(request.chat, settings, bad)

    sampling, max_tokens_set = _sampling(request, settings, max_model_len, bad)
    if calls_constraint is not None:
        if sampling.constraint is not None:
            bad(f"sampling.{request.sampling.WhichOneof('constraint')}", _FORCED_CALLS)
        sampling = dataclasses.replace(sampling, constraint=calls_constraint)
    _token_controls(request.sampling, settings, vocab_size, bad)
    truncate: int | None = None
    if request.sampling.HasField("truncate_prompt_tokens"):
        truncate = request.sampling.truncate_prompt_tokens
        if not 1 <= truncate < max_model_len:
            bad("sampling.truncate_prompt_tokens", f"must be between 1 and {max_model_len - 1}")
        # the last tokens could begin inside an image's (a video's) placeholder tokens
        if request.images:
            bad("sampling.truncate_prompt_tokens", "cannot be used with images")
        elif request.videos:
            bad("sampling.truncate_prompt_tokens", "cannot be used with videos")
    if kind == "token_ids" and request.images:
        # an image's tokens are the engine's to place: it needs the placeholder in a text
        bad("images", "token_ids take no images; send the prompt as text or chat")
    elif takes_images:
        text_field = "prompt" if kind == "prompt" else "chat.messages"
        texts = [prompt] if prompt is not None else [t.content for t in chat or ()]
        _images(request.images, texts, text_field, settings, bad)
    videos: tuple[VideoInput, ...] = ()
    if request.videos and kind != "chat":
        # the model's video tokens are its chat template's to place
        bad("videos", "videos go with chat: place each with <video> in a message")
    elif takes_video and request.videos:
        contents = [turn.content for turn in chat or ()]
        videos = checked_videos(request.videos, contents, settings.media, bad)

    request_id = request.request_id
    # fullmatch: "$" would let a trailing newline through, into logs and spans
    if request_id and not _REQUEST_ID.fullmatch(request_id):
        bad("request_id", "1 to 128 characters of letters, digits and ._:/-")
    if request.cache_policy not in _POLICIES:
        bad("cache_policy", f"unknown value {request.cache_policy}")

    if problems:
        if unlisted:
            problems.append(Violation("request", f"{unlisted} more problems, not listed"))
        raise InvalidRequest(problems)
    return GenerationRequest(
        prompt=prompt,
        chat=chat,
        sampling=sampling,
        max_tokens_set=max_tokens_set,
        request_id=request_id or uuid.uuid4().hex,
        cache_policy=_POLICIES[request.cache_policy],
        images=tuple(image_input(i, image) for i, image in enumerate(request.images)),
        truncate_prompt_tokens=truncate,
        token_ids=token_ids,
        tools=tools,
        include_reasoning=not request.HasField("include_reasoning") or request.include_reasoning,
        videos=videos,
    )


def _chat(
    messages: Sequence[pb.ChatMessage], settings: Settings, bad: Callable[[str, str], None]
) -> tuple[ChatTurn, ...]:
    """A chat of a count within the limit: each message's role, content and calls checked."""
    total = 0
    for i, message in enumerate(messages):
        where = f"chat.messages[{i}]"
        if _has_unknown_fields(message):
            bad(where, "carries fields this server does not know")
        if message.role not in ROLES:
            bad(f"{where}.role", f"{message.role!r} is not one of {', '.join(sorted(ROLES))}")
        if not message.content.strip() and not message.tool_calls:
            bad(f"{where}.content", "must not be empty")
        total += len(message.content) + sum(len(c.arguments) for c in message.tool_calls)
    if total > settings.max_prompt_chars:
        bad("chat.messages", f"{total} characters; the limit is {settings.max_prompt_chars}")
        return ()
    return tuple(
        ChatTurn(m.role, m.content, tool_call_id, calls)
        for m, (tool_call_id, calls) in zip(
            messages, tool_turn_fields(messages, settings, bad), strict=True
        )
    )


def _token_ids(
    message: pb.TokenIds,
    max_model_len: int,
    vocab_size: int | None,
    bad: Callable[[str, str], None],
) -> tuple[int, ...]:
    """A tokenized prompt: not empty, within the context, every id in the vocabulary."""
    if _has_unknown_fields(message):
        bad("token_ids", "carries fields this server does not know")
    return checked_ids(message.ids, "token_ids.ids", max_model_len, vocab_size, bad)


def checked_ids(
    given: Sequence[int],
    field: str,
    max_model_len: int,
    vocab_size: int | None,
    bad: Callable[[str, str], None],
) -> tuple[int, ...]:
    """Token ids sent under ``field``: not empty, within the context, each in the vocabulary
    (``vocab_size`` None: any); each problem told to ``bad``."""
    count = len(given)
    if count >= max_model_len:
        # counted, never copied: a message of millions of ids is refused as it came
        bad(field, f"{count} tokens; the model takes at most {max_model_len - 1}")
        return ()
    ids = tuple(given)
    if not ids:
        bad(field, "must hold at least one token id")
    elif vocab_size is not None:
        outside = [i for i, token in enumerate(ids) if token >= vocab_size]
        for i in outside[:_NAMED_IDS]:
            bad(f"{field}[{i}]", f"{ids[i]} is not below the vocabulary's {vocab_size}")
        if len(outside) > _NAMED_IDS:
            bad(field, f"{len(outside)} ids in all are not below {vocab_size}")
    return ids


def image_input(index: int, image: pb.Image) -> ImageInput:
    """A checked pb.Image as the pipeline takes it."""
    source = image.WhichOneof("source")
    if source == "data":
        return ImageInput(index, image.data, mime_type=image.mime_type)
    if source == "url":
        return ImageInput(index, None, url=image.url, mime_type=image.mime_type)
    return ImageInput(index, None, digest=image.digest, mime_type=image.mime_type)


def _images(
    images: Sequence[pb.Image],
    texts: Sequence[str],
    text_field: str,
    settings: Settings,
    bad: Callable[[str, str], None],
) -> None:
    limits = settings.media
    if len(images) > limits.max_images_per_request:
        bad("images", f"{len(images)} images; the limit is {limits.max_images_per_request}")
        return
    placeholders = sum(text.count(IMAGE_PLACEHOLDER) for text in texts)
    if placeholders != len(images):
        bad(
            text_field,
            f"{placeholders} {IMAGE_PLACEHOLDER} placeholders for {len(images)} images;"
            " each image needs one, in order",
        )
    for i, image in enumerate(images):
        where = f"images[{i}]"
        media_source(image, where, bad)
        for violation in image_violations(image, settings, f"{where}."):
            bad(violation.field, violation.description)


def image_violations(image: pb.Image, settings: Settings, prefix: str = "") -> list[Violation]:
    """What is wrong with an image's bytes and mime type, fields named after ``prefix``."""
    found: list[Violation] = []
    limit = settings.media.max_image_bytes
    if image.WhichOneof("source") == "data":
        if not image.data:
            found.append(Violation(f"{prefix}data", "must not be empty"))
        elif len(image.data) > limit:
            found.append(
                Violation(f"{prefix}data", f"{len(image.data)} bytes; the limit is {limit}")
            )
    if image.WhichOneof("source") == "url":
        found += url_violations(image.url, f"{prefix}url")
    if image.mime_type and image.mime_type not in MIME_TYPES:
        found.append(
            Violation(
                f"{prefix}mime_type", f"{image.mime_type!r} is not one of {', '.join(MIME_TYPES)}"
            )
        )
    return found


def _sampling(
    request: pb.GenerateRequest,
    settings: Settings,
    max_model_len: int,
    bad: Callable[[str, str], None],
) -> tuple[Sampling, bool]:
    s = request.sampling
    if _has_unknown_fields(s):
        bad("sampling", "carries fields this server does not know")
    max_tokens_set = s.HasField("max_tokens")
    max_tokens = s.max_tokens if max_tokens_set else max_model_len
    if max_tokens_set and not 1 <= s.max_tokens < max_model_len:
        bad("sampling.max_tokens", f"must be between 1 and {max_model_len - 1}")
    checks: list[tuple[str, bool, str]] = [
        ("temperature", _finite(s.temperature) and 0 <= s.temperature <= 2, "between 0 and 2"),
        ("top_p", _finite(s.top_p) and 0 < s.top_p <= 1, "in (0, 1]"),
        ("top_k", s.top_k >= -1, "-1 or 0 (all tokens) or a positive count"),
        ("min_p", _finite(s.min_p) and 0 <= s.min_p <= 1, "in [0, 1]"),
        (
            "presence_penalty",
            _finite(s.presence_penalty) and -2 <= s.presence_penalty <= 2,
            "in [-2, 2]",
        ),
        (
            "frequency_penalty",
            _finite(s.frequency_penalty) and -2 <= s.frequency_penalty <= 2,
            "in [-2, 2]",
        ),
        (
            "repetition_penalty",
            _finite(s.repetition_penalty) and 0 < s.repetition_penalty <= 10,
            "in (0, 10]",
        ),
        ("seed", s.seed >= 0, "0 or more"),
        (
            "stream_interval",
            1 <= s.stream_interval <= max_model_len,
            f"between 1 and {max_model_len}",
        ),
        ("n", 1 <= s.n <= settings.max_samples, f"between 1 and {settings.max_samples}"),
        ("logprobs", s.logprobs <= MAX_LOGPROBS, f"between 0 and {MAX_LOGPROBS}"),
        ("prompt_logprobs", s.prompt_logprobs <= MAX_LOGPROBS, f"between 0 and {MAX_LOGPROBS}"),
    ]
    for name, ok, rule in checks:
        if s.HasField(name) and not ok:
            bad(f"sampling.{name}", f"{getattr(s, name)!r} is not {rule}")
    # repeated fields past their count are refused before anything is built from them
    stops: tuple[str, ...] = ()
    if len(s.stop) > settings.max_stop_strings:
        bad("sampling.stop", f"{len(s.stop)} strings; the limit is {settings.max_stop_strings}")
    else:
        stops = tuple(s.stop)
    for i, stop in enumerate(stops):
        if not stop or len(stop) > MAX_STOP_CHARS:
            bad(f"sampling.stop[{i}]", f"must hold 1 to {MAX_STOP_CHARS} characters")
    stop_ids = s.stop_token_ids
    biases = s.logit_bias

    def optional(name: str) -> float | None:
        return getattr(s, name) if s.HasField(name) else None

    top_k = s.top_k if s.HasField("top_k") else None
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=optional("temperature"),
        top_p=optional("top_p"),
        top_k=-1 if top_k == 0 else top_k,
        seed=s.seed if s.HasField("seed") else None,
        stop=stops,
        presence_penalty=optional("presence_penalty"),
        frequency_penalty=optional("frequency_penalty"),
        repetition_penalty=optional("repetition_penalty"),
        min_p=optional("min_p"),
        ignore_eos=s.ignore_eos,
        stream_interval=s.stream_interval if s.HasField("stream_interval") else None,
        min_tokens=s.min_tokens,
        stop_token_ids=tuple(stop_ids) if len(stop_ids) <= settings.max_stop_token_ids else (),
        include_stop_str_in_output=s.include_stop_str_in_output,
        skip_special_tokens=s.skip_special_tokens if s.HasField("skip_special_tokens") else True,
        logit_bias=tuple(sorted(biases.items())) if len(biases) <= settings.max_logit_bias else (),
        constraint=checked_constraint(s, settings, bad),
        n=s.n if s.HasField("n") else 1,
        logprobs=s.logprobs if s.HasField("logprobs") else None,
        prompt_logprobs=s.prompt_logprobs if s.HasField("prompt_logprobs") else None,
    )
    if sampling.n > 1 and sampling.temperature == 0.0:
        # the engine refuses it: greedy sampling gives one answer, n times
        bad("sampling.n", f"{sampling.n} samples need a temperature above 0")
    if s.HasField("min_tokens") and max_tokens_set and s.min_tokens > max_tokens:
        bad("sampling.min_tokens", f"{s.min_tokens} is more than max_tokens ({max_tokens})")
    elif s.min_tokens >= max_model_len:
        bad("sampling.min_tokens", f"must be less than the model's {max_model_len} tokens")
    return sampling, max_tokens_set


def _token_controls(
    s: pb.SamplingParams,
    settings: Settings,
    vocab_size: int | None,
    bad: Callable[[str, str], None],
) -> None:
    """Token ids against the vocabulary, biases against their range, counts against limits."""
    vocab = vocab_size if vocab_size is not None else 2**32
    if len(s.stop_token_ids) > settings.max_stop_token_ids:
        count, limit = len(s.stop_token_ids), settings.max_stop_token_ids
        bad("sampling.stop_token_ids", f"{count} ids; the limit is {limit}")
    for i, token in enumerate(s.stop_token_ids[: settings.max_stop_token_ids]):
        if token >= vocab:
            bad(f"sampling.stop_token_ids[{i}]", f"{token} is not below the vocabulary's {vocab}")
    if len(s.logit_bias) > settings.max_logit_bias:
        count, limit = len(s.logit_bias), settings.max_logit_bias
        bad("sampling.logit_bias", f"{count} entries; the limit is {limit}")
        return
    for token, bias in sorted(s.logit_bias.items()):
        where = f"sampling.logit_bias[{token}]"
        if token >= vocab:
            bad(where, f"token {token} is not below the vocabulary's {vocab}")
        if not (_finite(bias) and -100 <= bias <= 100):
            bad(where, f"{bias!r} is not between -100 and 100")
