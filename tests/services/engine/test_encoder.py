"""The tiny LLaVA in a real vLLM engine: pixels, cached uuids and mmgate's embeddings agree.

One ``AsyncLLM`` in this process (its engine core in a spawned child) serves the whole module;
every test shares its event loop, since vLLM's output handler lives on the loop of the first
request. The prompts are token ids with one ``<image>`` id per image, as mmgate sends them.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import random
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from PIL import Image

from services.engine.encoder import VisionEncoder
from services.engine.tensors import tensor_nbytes
from services.models import IMAGE_TOKEN, TINY_LLAVA_IMAGE_SIZE, build_tiny_llava

# The engine's tests share one loop: vLLM's output handler runs on the first request's loop.
shared_loop = pytest.mark.asyncio(loop_scope="module")

# see services.models.tiny_llava: bf16 kernels differ enough to flip greedy tokens
DTYPE = "float32"
MiB = 1024 * 1024
MAX_TOKENS = 12
REQUEST_TIMEOUT = 60.0
_request_ids = itertools.count()


def noise(seed: int, size: tuple[int, int] = (TINY_LLAVA_IMAGE_SIZE,) * 2) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3))


IMAGES = {
    "noise-1": noise(1),
    "noise-2": noise(2),
    "noise-3": noise(3),
    "solid": Image.new("RGB", (TINY_LLAVA_IMAGE_SIZE,) * 2, (200, 30, 60)),
    # resized and cropped by the processor: both paths must use the same one
    "noise-80x64": noise(4, (80, 64)),
}


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")


@pytest.fixture(scope="module")
def encoder(tiny_llava: Path) -> VisionEncoder:
    loaded = VisionEncoder.load(tiny_llava, dtype=DTYPE)
    assert loaded is not None
    return loaded


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_llava: Path) -> AsyncIterator[Any]:
    """On the tests' loop, so that it shuts down while its output handler's loop still runs."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(tiny_llava),
        dtype=DTYPE,
        enforce_eager=True,
        kv_cache_memory_bytes=128 * MiB,
        max_model_len=512,
        enable_mm_embeds=True,
        enable_prefix_caching=True,
        seed=0,
        enable_log_requests=False,
    )
    engine = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
    yield engine
    # shutdown() joins the engine core process: off the loop, as services.engine does it
    await asyncio.to_thread(engine.shutdown)
    # Collected now rather than at interpreter exit, where AsyncLLM.__del__ (a second shutdown)
    # fails for want of the modules it calls; vLLM never terminates its ZMQ context, whose
    # collection warns (filtered above).
    del engine
    gc.collect()


def prompt_ids(model: Path, images: int = 1, text: str = "What is in the image?") -> list[int]:
    """Token ids of a one-turn chat with ``images`` image parts, as mmgate tokenizes it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    content: list[dict[str, str]] = [{"type": "image"}] * images
    content.append({"type": "text", "text": text})
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = tokenizer.encode(rendered, add_special_tokens=False)
    assert ids.count(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)) == images
    return ids


def request(ids: list[int], data: object, uuids: Sequence[str] | None = None) -> dict[str, Any]:
    prompt: dict[str, Any] = {"prompt_token_ids": ids, "multi_modal_data": {"image": data}}
    if uuids is not None:
        prompt["multi_modal_uuids"] = {"image": list(uuids)}
    return prompt


async def greedy(engine: Any, prompt: dict[str, Any], max_tokens: int = MAX_TOKENS) -> Any:
    """The finished output of one greedy request."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    final = None
    async with asyncio.timeout(REQUEST_TIMEOUT):
        async for output in engine.generate(prompt, params, f"tiny-llava-{next(_request_ids)}"):
            final = output
    assert final is not None
    assert final.finished
    return final


def test_encoder_shape_and_size(encoder: VisionEncoder) -> None:
    embeddings = encoder.encode([IMAGES["noise-1"], IMAGES["solid"]])
    # 4x4 patches of 14 px, CLS dropped ("default"), projected to the Llama's hidden size
    assert (encoder.image_tokens, encoder.hidden_size) == (16, 128)
    assert embeddings.shape == (2, 16, 128)
    assert embeddings.dtype == torch.float32
    assert tensor_nbytes(embeddings) == 2 * 16 * 128 * 4
    assert encoder.encode([]).shape == (0, 16, 128)


def test_encoder_is_thread_safe(encoder: VisionEncoder) -> None:
    images = list(IMAGES.values())
    alone = [encoder.encode([image]) for image in images]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda image: encoder.encode([image]), images * 3))
    for index, embeddings in enumerate(together):
        assert torch.equal(embeddings, alone[index % len(images)])


def test_encoder_declines_other_architectures(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert VisionEncoder.load(tmp_path, dtype=DTYPE) is None


@shared_loop
async def test_embeddings_give_the_same_answer_as_pixels(
    engine: Any, encoder: VisionEncoder, tiny_llava: Path
) -> None:
    ids = prompt_ids(tiny_llava)
    answers = {}
    for name, image in IMAGES.items():
        from_pixels = await greedy(engine, request(ids, [image], [f"pixels-{name}"]))
        embeddings = await asyncio.to_thread(encoder.encode, [image])
        from_embeddings = await greedy(engine, request(ids, embeddings, [f"embeds-{name}"]))
        tokens = list(from_pixels.outputs[0].token_ids)
        assert list(from_embeddings.outputs[0].token_ids) == tokens, name
        # vLLM expanded the one <image> id into one position per embedding
        for output in (from_pixels, from_embeddings):
            assert len(output.prompt_token_ids) == len(ids) - 1 + encoder.image_tokens
        assert len(set(tokens)) > MAX_TOKENS // 2, f"degenerate output {tokens}"
        answers[name] = tuple(tokens)
    assert len(set(answers.values())) == len(IMAGES), "the answer must depend on the image"


@shared_loop
async def test_a_batch_gives_each_image_its_own_embeddings_and_answer(
    engine: Any, encoder: VisionEncoder, tiny_llava: Path
) -> None:
    """What mmgate's batching does (services/pipeline/media/batching.py): images of different
    requests through one run of the encoder, each request given its own row."""
    ids = prompt_ids(tiny_llava)
    images = list(IMAGES.values()) + [noise(seed) for seed in range(10, 13)]
    alone = [await asyncio.to_thread(encoder.encode, [image]) for image in images]
    together = await asyncio.to_thread(encoder.encode, images)
    assert together.shape == (len(images), encoder.image_tokens, encoder.hidden_size)
    for index, single in enumerate(alone):
        # float32: batch shapes change the kernels' summation order, not more
        torch.testing.assert_close(together[index], single[0], rtol=1e-5, atol=1e-5)
    for index, single in enumerate(alone):
        from_single = await greedy(engine, request(ids, single, [f"single-{index}"]))
        from_batch = await greedy(engine, request(ids, together[index : index + 1], [f"b-{index}"]))
        assert from_batch.outputs[0].token_ids == from_single.outputs[0].token_ids, index


@shared_loop
async def test_several_images_in_one_prompt(
    engine: Any, encoder: VisionEncoder, tiny_llava: Path
) -> None:
    ids = prompt_ids(tiny_llava, images=2)
    images = [IMAGES["noise-2"], IMAGES["solid"]]
    from_pixels = await greedy(engine, request(ids, images))
    embeddings = await asyncio.to_thread(encoder.encode, images)
    from_embeddings = await greedy(engine, request(ids, embeddings))
    assert from_embeddings.outputs[0].token_ids == from_pixels.outputs[0].token_ids
    assert len(from_pixels.prompt_token_ids) == len(ids) + 2 * (encoder.image_tokens - 1)


@shared_loop
async def test_uuid_without_data_is_served_from_vllms_cache(engine: Any, tiny_llava: Path) -> None:
    # Long enough for whole KV blocks (128 tokens on a CPU), so the prefix cache shows its hits.
    ids = prompt_ids(tiny_llava, text=" ".join(["cache"] * 300))
    first = await greedy(engine, request(ids, [IMAGES["noise-3"]], ["digest-noise-3"]))
    again = await greedy(engine, request(ids, [None], ["digest-noise-3"]))
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert again.num_cached_tokens > 0
    # the prefix cache is keyed on the uuid, not on the pixels
    renamed = await greedy(engine, request(ids, [IMAGES["noise-3"]], ["another-digest"]))
    assert renamed.num_cached_tokens == 0


@shared_loop
async def test_unknown_uuid_fails_only_its_request(engine: Any, tiny_llava: Path) -> None:
    from vllm.v1.engine.exceptions import EngineGenerateError

    ids = prompt_ids(tiny_llava)
    with pytest.raises(EngineGenerateError) as failure:
        await greedy(engine, request(ids, [None], ["never-sent"]))
    assert isinstance(failure.value.__cause__, ValueError)
    assert "Cache miss" in str(failure.value.__cause__)
    assert not engine.errored
    after = await greedy(engine, request(ids, [IMAGES["solid"]], ["digest-solid"]))
    assert len(after.outputs[0].token_ids) == MAX_TOKENS
