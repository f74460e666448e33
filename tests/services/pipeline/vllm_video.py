"""vLLM's own answer for a clip, for the video tests to compare mmgate's with: its OpenCV loader
samples the clip, the model's chat template renders the chat as the bundled client builds it
(the placeholder before the text, on a line of its own), its engine encodes the frames."""

from __future__ import annotations

import uuid

from services.api.server import MmgateServer
from tests.services.in_process import vllm_worker


async def vllm_answer(
    server: MmgateServer, data: bytes, frames: int, text: str, max_tokens: int = 8
) -> tuple[list[int], int]:
    """(the greedy answer's token ids, the prompt's length) from the server's own engine."""
    from vllm import SamplingParams
    from vllm.multimodal.video import VideoBackend

    engine = vllm_worker(server)._require()
    sampled, _ = VideoBackend.load_bytes(data, num_frames=frames)
    tokenizer = engine.get_tokenizer()
    parts = [{"type": "video"}, {"type": "text", "text": f"\n{text}"}]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    final = None
    async for output in engine.generate(
        {"prompt_token_ids": list(ids), "multi_modal_data": {"video": sampled}},
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        f"vllm-{uuid.uuid4().hex}",
    ):
        final = output
    assert final is not None
    return list(final.outputs[0].token_ids), len(final.prompt_token_ids)


__all__ = ["vllm_answer"]
