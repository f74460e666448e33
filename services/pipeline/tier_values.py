"""What the Redis tier stores of each stage, and how (the bytes are engine/values.py's format).

    embedding  an encoder output: one tensor (its dtype kept, bf16 included)
    video      a clip's sampled frames: one uint8 tensor (frames, height, width, 3); decoding a
               clip again costs far more than the round trip
    video_embedding  a clip's encoder output: one tensor, its patch grid and frames in the header
    response   a shared response that finished normally: its deltas (sample, text, tokens, finish
               and stop reasons, cached and prompt token counts, log-probabilities), read back as
               a finished recording

Not held there: prompts (rendering and tokenizing is cheaper than a round trip) and decoded
images (the request carries the image's bytes; decoding them again costs milliseconds, and the
decoded pixels are several times the size of the bytes they came from).

Each value is sealed for the full Redis key it is written under, and read back only under that
key; with a deployment secret, it also carries a MAC only the secret's holders can make.
"""

from __future__ import annotations

from typing import Any, final

from cache_actor import Stage

from ..engine.values import (
    BadValue,
    seal_clip,
    seal_frames,
    seal_json,
    seal_tensor,
    unseal_clip,
    unseal_frames,
    unseal_json,
    unseal_tensor,
)
from ..types import EngineDelta, Logprob, TokenLogprobs
from .media.stages import Embedding
from .media.videos import ClipFrames
from .responses import ResponseRecording


@final
class EmbeddingCodec:
    __slots__ = ("secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret

    def encode(self, value: Any, key: str) -> bytes:
        assert isinstance(value, Embedding)
        return seal_tensor(Stage.EMBEDDING, value.tensor, key=key, secret=self.secret)

    def decode(self, data: bytes, key: str) -> Embedding:
        return Embedding(unseal_tensor(data, Stage.EMBEDDING, key=key, secret=self.secret))


@final
class VideoCodec:
    __slots__ = ("secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret

    def encode(self, value: Any, key: str) -> bytes:
        assert isinstance(value, ClipFrames)
        return seal_frames(Stage.VIDEO, value.frames, key=key, secret=self.secret)

    def decode(self, data: bytes, key: str) -> ClipFrames:
        return ClipFrames(unseal_frames(data, Stage.VIDEO, key=key, secret=self.secret))


@final
class ClipEmbeddingCodec:
    __slots__ = ("secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret

    def encode(self, value: Any, key: str) -> bytes:
        return seal_clip(Stage.VIDEO_EMBEDDING, value, key=key, secret=self.secret)

    def decode(self, data: bytes, key: str) -> Any:
        return unseal_clip(data, Stage.VIDEO_EMBEDDING, key=key, secret=self.secret)


@final
class ResponseCodec:
    __slots__ = ("secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret

    def encode(self, value: Any, key: str) -> bytes:
        if not isinstance(value, ResponseRecording) or not value.done or value.error is not None:
            raise ValueError("only a response that finished normally is written")
        deltas = [
            [
                d.text,
                list(d.token_ids),
                d.finish_reason,
                d.num_cached_tokens,
                d.prompt_tokens,
                d.index,
                d.stop_reason,
                [_position(p) for p in d.logprobs],
                [_position(p) for p in d.prompt_logprobs],
            ]
            for d in value.deltas
        ]
        return seal_json(Stage.RESPONSE, {"deltas": deltas}, key=key, secret=self.secret)

    def decode(self, data: bytes, key: str) -> ResponseRecording:
        body = unseal_json(data, Stage.RESPONSE, key=key, secret=self.secret)
        try:
            deltas = [
                EngineDelta(
                    text=str(text),
                    token_ids=tuple(int(t) for t in ids),
                    finish_reason=None if reason is None else str(reason),
                    num_cached_tokens=int(cached),
                    prompt_tokens=int(prompt),
                    index=int(index),
                    stop_reason=stop if stop is None or isinstance(stop, int | str) else str(stop),
                    logprobs=tuple(map(_read_position, logprobs)),
                    prompt_logprobs=tuple(map(_read_position, prompt_logprobs)),
                )
                for (
                    text,
                    ids,
                    reason,
                    cached,
                    prompt,
                    index,
                    stop,
                    logprobs,
                    prompt_logprobs,
                ) in body["deltas"]
            ]
        except (TypeError, ValueError, KeyError) as exc:
            raise BadValue(f"not a response ({exc})") from None
        ended = {d.index for d in deltas if d.finish_reason is not None}
        if not deltas or ended != {d.index for d in deltas}:
            raise BadValue("a response that did not finish")
        return ResponseRecording.finished(deltas)


def _position(position: TokenLogprobs) -> list[Any]:
    token = position.token
    return [
        token.token_id,
        token.logprob,
        token.text,
        [[alt.token_id, alt.logprob, alt.text] for alt in position.top],
    ]


def _read_position(stored: Any) -> TokenLogprobs:
    token_id, logprob, text, top = stored
    return TokenLogprobs(
        Logprob(int(token_id), float(logprob), str(text)),
        tuple(Logprob(int(i), float(lp), str(t)) for i, lp, t in top),
    )


def codecs(secret: bytes | None = None) -> dict[str, Any]:
    """The stages' codecs; ``secret``: the deployment's value secret (MAC'd values), if any."""
    return {
        Stage.EMBEDDING: EmbeddingCodec(secret),
        Stage.RESPONSE: ResponseCodec(secret),
        Stage.VIDEO: VideoCodec(secret),
        Stage.VIDEO_EMBEDDING: ClipEmbeddingCodec(secret),
    }


__all__ = ["ClipEmbeddingCodec", "EmbeddingCodec", "ResponseCodec", "VideoCodec", "codecs"]
