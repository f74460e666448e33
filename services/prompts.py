"""The text path's cache stage: a request's rendered and tokenized prompt, keyed by content.

Rendering a chat template and tokenizing are CPU work, so they run in a thread, inside a cache-actor
flight: identical prompts arriving together are tokenized once, and again never while cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .spans import span
from .validation import IMAGE_PLACEHOLDER, GenerationRequest


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    token_ids: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        # what the cache actor weighs: a Python int in a tuple is ~36 bytes
        return len(self.text) + 36 * len(self.token_ids)


def cache_key(model: str, stage: str, payload: Any) -> str:
    """A content digest: the same model, stage and input give the same key, on every replica."""
    canonical = json.dumps([model, stage, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


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


async def render(tokenizer: Any, request: GenerationRequest) -> RenderedPrompt:
    """Render and tokenize off the event loop."""
    with span("prompt.render") as current:
        rendered = await asyncio.to_thread(_render, tokenizer, request)
        if current is not None:
            current.set_attribute("mmgate.prompt.tokens", len(rendered.token_ids))
        return rendered
