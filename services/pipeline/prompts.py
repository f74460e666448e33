"""The prompt stage: a request's rendered and tokenized prompt, keyed by content.

    GenerationRequest ─ prompt_payload ─▶ cache key ─▶ cache flight: render (chat template or raw
    text) and tokenize in a thread ─▶ RenderedPrompt, cached

Rendering a chat template and tokenizing are CPU work, so they run in a thread, inside a cache-actor
flight: identical prompts arriving together are tokenized once, and again never while cached.
"""

from __future__ import annotations

import time
from typing import Any, final

from cache_actor import CacheActor

from ..keys import cache_key
from ..observability.lookups import stage
from ..observability.spans import span
from ..types import GenerationRequest, RenderedPrompt
from ..wire import IMAGE_PLACEHOLDER
from .request import MEMORY_ONLY, Request
from .threads import StageThreads


def prompt_payload(request: GenerationRequest) -> Any:
    if request.chat is not None:
        turns = [[turn.role, turn.content] for turn in request.chat]
        # with images, messages are rendered as content parts: another prompt
        return {"chat": turns, "parts": True} if request.images else {"chat": turns}
    return {"prompt": request.prompt}


def content_parts(content: str) -> list[dict[str, str]]:
    """A message's text as OpenAI-style content parts, an image part for each placeholder.

    Chat templates of vision models place the model's own image tokens for {"type": "image"}.
    """
    parts: list[dict[str, str]] = []
    for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
        if i > 0:
            parts.append({"type": "image"})
        if text:
            parts.append({"type": "text", "text": text})
    return parts


def _render(tokenizer: Any, request: GenerationRequest) -> RenderedPrompt:
    if request.chat is not None:
        messages: list[dict[str, Any]] = [
            {"role": t.role, "content": content_parts(t.content) if request.images else t.content}
            for t in request.chat
        ]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # the template already holds the special tokens it wants
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        assert request.prompt is not None
        text = request.prompt
        ids = tokenizer(text)["input_ids"]
    return RenderedPrompt(text=text, token_ids=tuple(int(i) for i in ids))


async def render(
    tokenizer: Any, request: GenerationRequest, threads: StageThreads
) -> RenderedPrompt:
    """Render and tokenize off the event loop, in the render stage's threads."""
    with span("prompt.render") as current:
        rendered = await threads.run("render", _render, tokenizer, request)
        if current is not None:
            current.set_attribute("mmgate.prompt.tokens", len(rendered.token_ids))
        return rendered


@final
class PromptStage:
    def __init__(self, cache: CacheActor, threads: StageThreads) -> None:
        self.cache = cache
        self.threads = threads

    async def prompt(self, request: Request, model: str, tokenizer: Any) -> RenderedPrompt:
        """The request's prompt: from the cache, or rendered (``bypass``: always rendered)."""
        checked = request.checked
        key = cache_key(model, "prompt", prompt_payload(checked))
        started = time.perf_counter()
        if checked.cache_policy == "bypass":
            rendered = await render(tokenizer, checked, self.threads)
            request.report("prompt", key, None, started)
            return rendered
        with stage("prompt"):
            lookup = await self.cache.get(
                key,
                lambda: render(tokenizer, checked, self.threads),
                tenant=request.tenant,
                timeout=request.left(),
                tier=MEMORY_ONLY,  # rendering again is cheaper than a round trip to Redis
            )
        request.report("prompt", key, lookup, started)
        return lookup.value


__all__ = ["PromptStage", "content_parts", "prompt_payload", "render"]
