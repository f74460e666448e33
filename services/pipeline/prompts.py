"""The prompt stage: a request's rendered and tokenized prompt, keyed by content.

    GenerationRequest ─ prompt_payload ─▶ cache key ─▶ cache flight: render (chat template or raw
    text) and tokenize in a thread, with that thread's own tokenizer ─▶ RenderedPrompt, cached
    token ids the caller sent ─▶ RenderedPrompt as they are (lookup: bypass, no key)

Rendering a chat template and tokenizing are CPU work, so they run in a thread, inside a cache-actor
flight: identical prompts arriving together are tokenized once, and again never while cached.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass
from typing import Any, Final, Literal, final

from cache_actor import Stage

from ..engine.tools import template_takes_tools
from ..keys import cache_key
from ..observability.spans import span
from ..types import ChatTurn, GenerationRequest, RenderedPrompt
from ..wire import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from .cache_front import CacheFront
from .request import Request
from .threads import ThreadPools
from .tool_template import HERMES_TOOLS_TEMPLATE, template_variables


def prompt_payload(request: GenerationRequest) -> Any:
    payload: dict[str, Any]
    if request.chat is not None:
        turns: list[list[Any]] = []
        for turn in request.chat:
            entry: list[Any] = [turn.role, turn.content]
            if turn.tool_call_id or turn.tool_calls:
                entry += [turn.tool_call_id, [list(astuple(call)) for call in turn.tool_calls]]
            turns.append(entry)
        # with images or videos, messages are rendered as content parts: another prompt
        parts = bool(request.images or request.videos)
        payload = {"chat": turns, "parts": True} if parts else {"chat": turns}
        if request.videos:
            payload["videos"] = True  # "<video>" is a part, not text
        if request.tools is not None and request.tools.tools:
            payload["tools"] = [list(astuple(tool)) for tool in request.tools.tools]
    else:
        payload = {"prompt": request.prompt}
    if request.truncate_prompt_tokens is not None:
        payload["truncate"] = request.truncate_prompt_tokens  # another prompt: its last tokens
    return payload


# a placeholder, as the content part it becomes
_PARTS: Final = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video"}
_IMAGES: Final = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")
_IMAGES_AND_VIDEOS: Final = re.compile(f"({'|'.join(map(re.escape, _PARTS))})")


def content_parts(content: str, *, videos: bool = False) -> list[dict[str, str]]:
    """A message's text as OpenAI-style content parts, an image part for each image placeholder
    and, in a request with videos, a video part for each video placeholder (without, "<video>"
    is text, as it was before mmgate took video).

    Chat templates of vision models place the model's own image (video) tokens for
    {"type": "image"} ({"type": "video"}).
    """
    parts: list[dict[str, str]] = []
    for piece in (_IMAGES_AND_VIDEOS if videos else _IMAGES).split(content):
        if piece in _PARTS:
            parts.append({"type": _PARTS[piece]})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


@final
class RenderTokenizers:
    """Tokenizers of the render stage's own: one for each render running, none of vLLM's.

    vLLM's tokenizer routes each call through a pool of copies it shares with its own tokenization
    on the event loop, and deep-copies another (100-200 ms) when the pool is empty
    (services/engine/tokenizers.py). The render stage's capacity bounds the renders running at
    once, so this queue never holds more copies than that, each made the first time a render
    finds the queue empty, and a render never waits for one another thread holds.
    """

    __slots__ = ("_idle", "_make")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()

    @contextlib.contextmanager
    def borrowed(self) -> Iterator[Any]:
        """A tokenizer no other thread uses until it is given back."""
        try:
            tokenizer = self._idle.get_nowait()
        except queue.Empty:
            tokenizer = self._make()
        try:
            yield tokenizer
        finally:
            self._idle.put(tokenizer)

    @property
    def copies(self) -> int:
        """Copies made so far (all idle when no render runs)."""
        return self._idle.qsize()


def _render(
    tokenizers: RenderTokenizers, request: GenerationRequest, tool_template: ToolTemplate
) -> RenderedPrompt:
    with tokenizers.borrowed() as tokenizer:
        return _render_with(tokenizer, request, tool_template)


def _decode(tokenizers: RenderTokenizers, token_ids: tuple[int, ...]) -> str:
    with tokenizers.borrowed() as tokenizer:
        text: str = tokenizer.decode(list(token_ids), skip_special_tokens=False)
        return text


def _message(turn: ChatTurn, parts: bool, videos: bool) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": turn.role,
        "content": content_parts(turn.content, videos=videos) if parts else turn.content,
    }
    if turn.tool_call_id:
        message["tool_call_id"] = turn.tool_call_id
    if turn.tool_calls:
        # arguments as an object, as chat templates (and vLLM's server) hand them on
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.loads(call.arguments)},
            }
            for call in turn.tool_calls
        ]
    return message


def _template_arguments(
    tokenizer: Any, request: GenerationRequest, tool_template: ToolTemplate
) -> dict[str, Any]:
    """The tools and, where the model's template would ignore them, mmgate's template."""
    tools = request.tools.tools if request.tools is not None else ()
    assert request.chat is not None
    with_tools = bool(tools) or any(t.tool_calls or t.role == "tool" for t in request.chat)
    arguments: dict[str, Any] = {}
    if tools:
        arguments["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": json.loads(tool.parameters),
                },
            }
            for tool in tools
        ]
    if (
        with_tools
        and tool_template.resolve(template_takes_tools(tokenizer.chat_template)) == "hermes"
    ):
        arguments["chat_template"] = HERMES_TOOLS_TEMPLATE
        arguments.update(template_variables())
    return arguments


def _render_with(
    tokenizer: Any, request: GenerationRequest, tool_template: ToolTemplate
) -> RenderedPrompt:
    if request.chat is not None:
        parts = bool(request.images or request.videos)
        videos = bool(request.videos)
        messages = [_message(turn, parts, videos) for turn in request.chat]
        text = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            tokenize=False,
            **_template_arguments(tokenizer, request, tool_template),
        )
        # the template already holds the special tokens it wants
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        assert request.prompt is not None
        text = request.prompt
        ids = tokenizer(text)["input_ids"]
    keep = request.truncate_prompt_tokens
    if keep is not None and len(ids) > keep:
        # the last tokens, as vLLM's server truncates; the text is what they decode to
        ids = ids[len(ids) - keep :]
        text = tokenizer.decode(ids)
    return RenderedPrompt(text=text, token_ids=tuple(int(i) for i in ids))


def tokenized(token_ids: tuple[int, ...], keep: int | None) -> RenderedPrompt:
    """A prompt the caller tokenized, its last ``keep`` tokens (None: all); no text."""
    if keep is not None and len(token_ids) > keep:
        token_ids = token_ids[len(token_ids) - keep :]
    return RenderedPrompt(text="", token_ids=token_ids)


@final
@dataclass(frozen=True, slots=True)
class ToolTemplate:
    """How a chat with tools is rendered: the setting (engine.tool_template)."""

    setting: Literal["auto", "model", "hermes"] = "auto"

    def resolve(self, model_takes_tools: bool) -> Literal["model", "hermes"]:
        """The template that renders tools, given whether the model's own takes them."""
        if self.setting == "auto":
            return "model" if model_takes_tools else "hermes"
        return self.setting


async def render(
    tokenizers: RenderTokenizers,
    request: GenerationRequest,
    threads: ThreadPools,
    tool_template: ToolTemplate = ToolTemplate(),
) -> RenderedPrompt:
    """Render and tokenize off the event loop, in the render pool's threads."""
    with span("prompt.render") as current:
        rendered = await threads.run("render", _render, tokenizers, request, tool_template)
        if current is not None:
            current.set_attribute("mmgate.prompt.tokens", len(rendered.token_ids))
        return rendered


@final
class PromptStage:
    def __init__(
        self,
        cache: CacheFront,
        threads: ThreadPools,
        tokenizer_copy: Callable[[], Any],
        tool_template: ToolTemplate = ToolTemplate(),
    ) -> None:
        self.cache = cache
        self.threads = threads
        self.tokenizers = RenderTokenizers(tokenizer_copy)
        self.tool_template = tool_template

    async def prompt(self, request: Request, model: str) -> RenderedPrompt:
        """The request's prompt: from the cache, or rendered (``bypass``: always rendered)."""
        checked = request.checked
        started = time.perf_counter()
        if checked.token_ids is not None:
            # nothing to render or tokenize, so nothing to look up: no key
            request.report(Stage.PROMPT, "", None, started)
            return tokenized(checked.token_ids, checked.truncate_prompt_tokens)
        key = cache_key(model, Stage.PROMPT, prompt_payload(checked))
        if checked.cache_policy == "bypass":
            rendered = await render(self.tokenizers, checked, self.threads, self.tool_template)
            request.report(Stage.PROMPT, key, None, started)
            return rendered
        lookup = await self.cache.get(
            key,
            lambda: render(self.tokenizers, checked, self.threads, self.tool_template),
            tenant=request.tenant,
            timeout=request.left(),
            tier=Stage.PROMPT.tier_use,
        )
        request.report(Stage.PROMPT, key, lookup, started)
        return lookup.value

    async def tokenize(self, checked: GenerationRequest) -> tuple[int, ...]:
        """The token ids :meth:`prompt` gives the engine for ``checked``, rendered the same way
        (Inference.Tokenize; not looked up or kept: a count asked for is seldom sent as it is)."""
        rendered = await render(self.tokenizers, checked, self.threads, self.tool_template)
        return rendered.token_ids

    async def detokenize(self, token_ids: tuple[int, ...]) -> str:
        """The ids' text, special tokens included, decoded in the render pool."""
        return await self.threads.run("render", _decode, self.tokenizers, token_ids)


__all__ = [
    "PromptStage",
    "RenderTokenizers",
    "ToolTemplate",
    "content_parts",
    "prompt_payload",
    "render",
    "tokenized",
]
