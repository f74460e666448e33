"""A reasoning model's thinking kept apart from its answer, by vLLM's reasoning parser.

    ReasoningParsers(name, tokenizer) ─ once, at start: the parser exists and takes the model's
        tokenizer (a parser whose think tokens the vocabulary lacks is refused here)
    .sample() ─▶ SampleReasoning, one per sample of a request (vLLM's parsers keep state)
        .split(text, token_ids, last) ─▶ (reasoning, content) of each delta, as vLLM's server
        streams them; at the last delta, what the parser still held back (a tag it waited to
        see whole) is handed out as its reading of the whole output places it

The same split serves streams and whole answers: a whole answer is one delta, or the run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final


@final
class _VocabularyOnce:
    """The tokenizer, its vocabulary read once: vLLM's parsers read it anew for each parser
    made (20 ms for a 49k vocabulary), and one is made for every sample."""

    __slots__ = ("_tokenizer", "_vocabulary")

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._vocabulary: dict[str, int] = tokenizer.get_vocab()

    def get_vocab(self) -> dict[str, int]:
        return self._vocabulary

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


@final
class SampleReasoning:
    """One sample's output split as it comes, by vLLM's streaming parse; the rest at the end."""

    __slots__ = ("_ids", "_parser", "_request", "_sent", "_text")

    def __init__(self, parser: Any, request: Any) -> None:
        self._parser = parser
        self._request = request
        self._text = ""
        self._ids: list[int] = []
        self._sent = ("", "")  # the reasoning and the content handed out so far

    def split(self, text: str, token_ids: Sequence[int], last: bool) -> tuple[str, str]:
        """This delta's (reasoning, content); with the ``last``, what the parser held back."""
        previous, previous_ids = self._text, list(self._ids)
        self._text += text
        self._ids.extend(token_ids)
        found = self._parser.extract_reasoning_streaming(
            previous, self._text, text, previous_ids, self._ids, list(token_ids)
        )
        reasoning = (found.reasoning or "") if found is not None else ""
        content = (found.content or "") if found is not None else ""
        self._sent = (self._sent[0] + reasoning, self._sent[1] + content)
        if not last:
            return reasoning, content
        # A parser holds back text that may begin a tag until the next delta shows it whole;
        # after the last, the parser's reading of the whole output says what is left to hand
        # out. Where the stream already said otherwise, the stream's word stands.
        read = self._parser.extract_reasoning(self._text, self._request)
        whole = (read[0] or "", read[1] or "")
        if not all(w.startswith(sent) for w, sent in zip(whole, self._sent, strict=True)):
            return reasoning, content  # never a piece twice, nor thinking made an answer
        return (
            reasoning + whole[0][len(self._sent[0]) :],
            content + whole[1][len(self._sent[1]) :],
        )


@final
class ReasoningParsers:
    """vLLM's reasoning parser of one name over the model's tokenizer."""

    __slots__ = ("_parser", "_request", "_tokenizer", "name")

    def __init__(self, name: str, tokenizer: Any) -> None:
        """ValueError: vLLM has no parser of that name, or it cannot read this model's
        tokens (its think tokens are not in the vocabulary)."""
        # vLLM imported here: the pipeline imports this module, and the API layer the pipeline
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.reasoning import ReasoningParserManager

        try:
            self._parser = ReasoningParserManager.get_reasoning_parser(name)
        except KeyError:
            raise ValueError(f"vLLM has no reasoning parser named {name!r}") from None
        self.name = name
        self._tokenizer = _VocabularyOnce(tokenizer)
        # the parsers read their options from an OpenAI request; an empty one is enough
        self._request = ChatCompletionRequest(messages=[], model="mmgate")
        try:
            self._parser(self._tokenizer)
        except (KeyError, RuntimeError, ValueError) as error:
            raise ValueError(
                f"reasoning parser {name!r} cannot read this model's output: {error}"
            ) from None

    def sample(self) -> SampleReasoning:
        return SampleReasoning(self._parser(self._tokenizer), self._request)


__all__ = ["ReasoningParsers", "SampleReasoning"]
