"""What both clients share: building requests, the digests the server holds, when to resend.

request ── by_reference ──┬── an image held ──► sent by digest ──► NOT_FOUND, IMAGE_NOT_FOUND
                          │                                                │ forget the digests
                          └── none held ──────► sent as built ◄────────────┘ (once)
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, final

import grpc
from google.rpc import error_details_pb2, status_pb2

from ..proto.mmgate.v1 import inference_pb2
from ..wire import (
    AFFINITY_HEADER,
    IMAGE_NOT_FOUND,
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    digest_of,
    is_digest,
)
from .tools import ToolLike, as_tool
from .tools import tool_choice as choice_of

DEFAULT_TARGET = "127.0.0.1:50051"
CACHE_POLICIES = {
    "prompt": inference_pb2.CACHE_POLICY_UNSPECIFIED,
    "response": inference_pb2.CACHE_POLICY_RESPONSE,
    "bypass": inference_pb2.CACHE_POLICY_BYPASS,
}


# digests this client remembers as held by the server, most recent last
HELD_DIGESTS = 4096


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[tuple[str, str] | inference_pb2.ChatMessage] | None = None,
    images: Sequence[bytes | str] = (),
    videos: Sequence[bytes | str | inference_pb2.Video] = (),
    raw: bool = False,
    request_id: str = "",
    cache_policy: str = "prompt",
    token_ids: Sequence[int] | None = None,
    adapter: str = "",
    priority: int | None = None,
    tools: Sequence[ToolLike] = (),
    tool_choice: str | None = None,
    parallel_tool_calls: bool | None = None,
    **sampling: Any,
) -> inference_pb2.GenerateRequest:
    """A GenerateRequest; ``sampling`` takes SamplingParams' fields (max_tokens, temperature,
    n, logprobs, prompt_logprobs...). ``adapter``: a LoRA adapter the caller may use (empty: its
    default, else the base model). ``priority``: lower is more urgent, within the caller's range
    (None: its tenant's default).

    The input: ``prompt`` (chat-rendered unless ``raw``), ``messages``, or ``token_ids`` (a
    prompt tokenized with the served model's tokenizer). ``images`` and ``videos`` (a chat's
    only): bytes, a URL for the server to fetch, or (videos) a Video message with its frame
    sampling; a prompt with none of their placeholders gets them in front. One constraint at most:
    ``json_schema`` (JSON text or a dict), ``regex``, ``grammar``, ``choice`` (a list of
    strings) or ``json_object=True``.

    A chat's tools (tools.py): ``tools`` (Tool messages, Python functions, or mappings of
    name, description and parameters), ``tool_choice`` ("none", "auto", "required" or a
    function's name) and ``parallel_tool_calls``; ``messages`` may hold ChatMessages (a
    ``calls_turn``, a ``tool_result``) beside (role, content) pairs."""
    fields = {k: v for k, v in sampling.items() if v is not None}
    if isinstance(fields.get("json_schema"), Mapping):
        fields["json_schema"] = json.dumps(fields["json_schema"])
    if "choice" in fields and not isinstance(fields["choice"], inference_pb2.Choices):
        fields["choice"] = inference_pb2.Choices(choices=list(fields["choice"]))
    request = inference_pb2.GenerateRequest(
        request_id=request_id,
        cache_policy=CACHE_POLICIES[cache_policy],
        sampling=inference_pb2.SamplingParams(**fields),
        images=[_image(image) for image in images],
        videos=[_video(video) for video in videos],
        adapter=adapter,
        priority=priority,
    )
    if token_ids is not None:
        request.token_ids.ids.extend(token_ids)
        return request
    turns = [
        turn if isinstance(turn, inference_pb2.ChatMessage) else _turn(*turn)
        for turn in messages or ()
    ]
    texts = [prompt or ""] + [turn.content for turn in turns]
    if images and prompt is not None and not any(IMAGE_PLACEHOLDER in t for t in texts):
        prompt = IMAGE_PLACEHOLDER * len(images) + "\n" + prompt
    if videos and prompt is not None and not any(VIDEO_PLACEHOLDER in t for t in texts):
        prompt = VIDEO_PLACEHOLDER * len(videos) + "\n" + prompt
    if raw:
        request.prompt = prompt or ""
    else:
        request.chat.messages.extend(
            turns + ([_turn("user", prompt)] if prompt is not None else [])
        )
        request.chat.tools.extend(as_tool(tool) for tool in tools)
        if tool_choice is not None:
            request.chat.tool_choice.CopyFrom(choice_of(tool_choice))
        if parallel_tool_calls is not None:
            request.chat.parallel_tool_calls = parallel_tool_calls
    return request


def tokenize_request(prompt: str | None = None, **input: Any) -> inference_pb2.TokenizeRequest:
    """A TokenizeRequest of the input :func:`build_request` makes of ``prompt`` or ``messages``
    (``tools``, ``raw``): what Generate would render."""
    built = build_request(prompt, **input)
    request = inference_pb2.TokenizeRequest()
    if built.HasField("chat"):
        request.chat.CopyFrom(built.chat)
    else:
        request.prompt = built.prompt
    return request


def _turn(role: str, content: str) -> inference_pb2.ChatMessage:
    return inference_pb2.ChatMessage(role=role, content=content)


def _image(image: bytes | str) -> inference_pb2.Image:
    """Bytes, or an image URL ("https://...") for the server to fetch."""
    if isinstance(image, str):
        return inference_pb2.Image(url=image)
    return inference_pb2.Image(data=image)


def _video(video: bytes | str | inference_pb2.Video) -> inference_pb2.Video:
    """Bytes, a video URL for the server to fetch, or a Video as it is."""
    if isinstance(video, inference_pb2.Video):
        return video
    if isinstance(video, str):
        return inference_pb2.Video(url=video)
    return inference_pb2.Video(data=video)


def affinity_of(request: inference_pb2.GenerateRequest) -> str | None:
    """The request's affinity key: the digest of its first image (else its first video), else
    of its system prompt (the prefix requests share); None for a request with none of them."""
    media = request.images or request.videos
    if media:
        first = media[0]
        if first.HasField("digest"):
            # only a well-formed one: anything else is the server's to refuse, and would not
            # even be a legal header value
            return first.digest if is_digest(first.digest) else None
        if first.HasField("url"):
            return digest_of(first.url.encode())  # the same URL meets the same replica
        return digest_of(first.data)
    if request.HasField("chat"):
        system = [m.content for m in request.chat.messages if m.role == "system"]
        if system:
            return digest_of("\n".join(system).encode())
    return None


def error_reason(error: grpc.RpcError) -> str:
    """The reason of mmgate's ErrorInfo detail (IMAGE_NOT_FOUND, OVERLOADED, ...); "" if none."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return str(info.reason)
    return ""


def image_not_found(error: grpc.RpcError) -> bool:
    """The server does not hold an image the request referred to by digest."""
    return error.code() == grpc.StatusCode.NOT_FOUND and error_reason(error) == IMAGE_NOT_FOUND


class HeldImages:
    """The digests the server has reported for this client's images, bounded, most recent last.

    ``by_reference`` swaps the bytes of a held image for its digest; a request that then fails
    with IMAGE_NOT_FOUND is sent again as it was built, with the bytes.
    """

    def __init__(self, capacity: int = HELD_DIGESTS) -> None:
        self.capacity = capacity
        self._digests: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, digest: str) -> bool:
        return digest in self._digests

    def add(self, digest: str) -> None:
        self._digests[digest] = None
        self._digests.move_to_end(digest)
        while len(self._digests) > self.capacity:
            self._digests.popitem(last=False)

    def learn(self, final: inference_pb2.GenerateFinal) -> None:
        for report in final.cache.images:
            self.add(report.digest)

    def by_reference(
        self, request: inference_pb2.GenerateRequest
    ) -> inference_pb2.GenerateRequest | None:
        """The request with held images as digests; None when no image is held."""
        digests = [
            digest_of(image.data) if image.WhichOneof("source") == "data" else ""
            for image in request.images
        ]
        if not any(d in self._digests for d in digests if d):
            return None
        slim = inference_pb2.GenerateRequest()
        slim.CopyFrom(request)
        for image, digest in zip(slim.images, digests, strict=True):
            if digest in self._digests:
                image.digest = digest  # the oneof drops the bytes
        return slim

    def forget(self, request: inference_pb2.GenerateRequest) -> None:
        for image in request.images:
            self._digests.pop(image.digest, None)


@final
class Attempts:
    """One call's requests, for both clients: ``current`` is sent first (held images as
    digests), and ``resend_with_bytes`` decides, once, whether it goes again as built."""

    __slots__ = ("_held", "_request", "current", "metadata")

    def __init__(
        self,
        held: HeldImages,
        request: inference_pb2.GenerateRequest,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._held = held
        self._request = request
        slim = held.by_reference(request)
        self.current = request if slim is None else slim
        # the client's metadata, and the request's affinity key for the mesh's hashing
        affinity = affinity_of(request)
        self.metadata = metadata if affinity is None else (*metadata, (AFFINITY_HEADER, affinity))

    def resend_with_bytes(self, error: grpc.RpcError, *, streamed: bool = False) -> bool:
        """True, and ``current`` becomes the request with the bytes, when ``current`` went by
        reference and the server no longer holds one of its images; False: raise ``error``.

        ``streamed``: the call already delivered events, which a resend would deliver twice
        (it does not happen: the server prepares images before the first token).
        """
        if self.current is self._request or streamed or not image_not_found(error):
            return False
        self._held.forget(self.current)
        self.current = self._request
        return True


__all__ = [
    "CACHE_POLICIES",
    "DEFAULT_TARGET",
    "HELD_DIGESTS",
    "Attempts",
    "HeldImages",
    "affinity_of",
    "build_request",
    "digest_of",
    "error_reason",
    "image_not_found",
    "tokenize_request",
]
