"""LoRA adapters per tenant, on the real engine: the session's SmolLM2 server (tests/services/
smollm2.py) with two test adapters configured at start, run-time loads from an adapter root, token
auth with three callers: alpha may use a1 and a2; beta may use a2 only, its default; ops is an
admin. Greedy answers (temperature 0) make each adapter's answer a fixed string to compare.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from services.client import Credentials, MmgateClient
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.auth.support import refused
from tests.services.prom import scrape
from tests.services.smollm2 import TOKENS
from tests.services.statuses import error_details, violated_fields
from tests.support import RunningServer

QUESTION = "What is the capital of France?"
GREEDY: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0, "cache_policy": "bypass"}


@pytest.fixture
def adapters_server(smollm2_server: RunningServer) -> RunningServer:
    return smollm2_server


@pytest.fixture
def root(adapter_root: Path) -> Path:
    return adapter_root


def caller(server: RunningServer, name: str) -> MmgateClient:
    return server.client(credentials=Credentials(token=TOKENS[name]), timeout=120.0)


async def answer(client: MmgateClient, adapter: str = "", **options: Any) -> pb.CompleteResponse:
    return await client.complete(QUESTION, adapter=adapter, **{**GREEDY, **options})


def reason(error: grpc.aio.AioRpcError) -> str:
    infos = [d for d in error_details(error) if isinstance(d, error_details_pb2.ErrorInfo)]
    return infos[0].reason if infos else ""


async def test_an_adapter_answers_otherwise_and_the_same_twice(
    adapters_server: RunningServer,
) -> None:
    async with caller(adapters_server, "alpha") as alpha:
        base = await answer(alpha)
        first = await answer(alpha, "a1")
        second = await answer(alpha, "a1")
    assert "Paris" in base.text
    assert first.text != base.text
    assert second.text == first.text
    assert (first.final.adapter.name, first.final.adapter.rank) == ("a1", 8)
    assert first.final.adapter.digest.startswith("sha256:")
    assert not base.final.HasField("adapter")


async def test_two_adapters_and_the_base_model_in_one_batch(
    adapters_server: RunningServer,
) -> None:
    names = ("", "a1", "a2")
    async with caller(adapters_server, "alpha") as alpha:
        alone = [await answer(alpha, name, max_tokens=12) for name in names]
        together = await asyncio.gather(*(answer(alpha, name, max_tokens=12) for name in names))
    assert len({response.text for response in alone}) == 3, alone
    # vLLM's CPU kernels gave a base-model row in such a batch an adapter's weights: the base
    # model's answer here is the proof that its null adapter keeps it apart
    assert together[0].text == alone[0].text
    # each adapter's row its own weights: its answer starts as it does alone. Not compared whole:
    # in bfloat16 (dtype auto on a CPU with it) a batch's shape moves the adapters' sums enough
    # for a near tie to fall the other way a few tokens in (seen: the 10th of 12)
    for batched, single in zip(together[1:], alone[1:], strict=True):
        assert batched.token_ids[:4] == single.token_ids[:4], (batched.text, single.text)
    assert len({tuple(response.token_ids[:4]) for response in together}) == 3, together
    metrics = await scrape(adapters_server.metrics_url)
    for name in ("base", "a1", "a2"):
        assert metrics.value("mmgate_adapter_requests_total", adapter=name) >= 2
        assert metrics.value("mmgate_adapter_generated_tokens_total", adapter=name) > 0


async def test_more_adapters_at_once_than_slots_wait_their_turn(
    adapters_server: RunningServer,
) -> None:
    """Two slots (MMGATE_ENGINE__MAX_LORAS=2) and four adapters served, two loaded at run
    time: every adapter and the base model asked at once, twice over. On the CPU the null
    adapter holds a slot vLLM's scheduler counts as free: three adapters in one step failed the
    engine for every tenant (KeyError in its LoRA mapping). Each answer is its own alone."""
    names = ("", "a1", "a2", "extra-a3", "extra-a1")
    async with caller(adapters_server, "ops") as ops:
        await ops.load_adapter("extra-a3", "a3")
        await ops.load_adapter("extra-a1", "a1")
        try:
            alone = [await answer(ops, name, max_tokens=8) for name in names]
            together = await asyncio.gather(
                *(answer(ops, name, max_tokens=8) for name in names * 2)
            )
            after = await answer(ops)  # the engine still serves
        finally:
            await ops.unload_adapter("extra-a3")
            await ops.unload_adapter("extra-a1")
    assert after.text == alone[0].text
    for batched, single in zip(together, alone * 2, strict=True):
        assert batched.token_ids[:4] == single.token_ids[:4], (batched.text, single.text)


async def test_unknown_and_forbidden_adapters_are_one_answer(
    adapters_server: RunningServer,
) -> None:
    async with caller(adapters_server, "beta") as beta:
        forbidden = await refused(answer(beta, "a1"))
        unknown = await refused(answer(beta, "nope"))
        default = await answer(beta)
        info = await beta.model_info()
    for error in (forbidden, unknown):
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert reason(error) == "ADAPTER_NOT_FOUND"
    assert forbidden.details().replace("a1", "X") == unknown.details().replace("nope", "X")
    assert default.final.adapter.name == "a2"  # beta's default
    assert [a.name for a in info.adapters] == ["a2"]
    assert info.default_adapter == "a2"
    async with caller(adapters_server, "alpha") as alpha:
        assert [a.name for a in (await alpha.model_info()).adapters] == ["a1", "a2"]


async def test_loads_are_an_admins(adapters_server: RunningServer, root: Path) -> None:
    async with caller(adapters_server, "alpha") as alpha:
        for call in (alpha.load_adapter("mine", str(root / "a3")), alpha.unload_adapter("a1")):
            error = await refused(call)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            assert reason(error) == "ADMIN_ONLY"


REFUSED_LOADS = [
    ("x", "empty", "path", "holds no adapter_config.json"),
    ("x", "broken-config", "path", "is not JSON"),
    ("x", "rank-32", "path", "rank 32 is above this server's maximum, 16"),
    ("x", "other-model", "path", "the model needs"),
    ("x", "../", "path", "not under the server's adapter root"),
    ("x", "/etc", "path", "not under the server's adapter root"),
    ("x", "missing", "path", "no such folder"),
    ("a1", "empty", "path", "holds no adapter_config.json"),  # a1 stays as it was
    ("no/slashes", "a3", "name", "letters, digits"),
]


async def test_a_refused_load_changes_nothing(adapters_server: RunningServer) -> None:
    async with caller(adapters_server, "ops") as ops:
        before = await ops.model_info()
        a1 = await answer(ops, "a1")
        for name, path, field, words in REFUSED_LOADS:
            error = await refused(ops.load_adapter(name, path))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, path
            assert reason(error) == "ADAPTER_REFUSED"
            assert violated_fields(error) == {field}
            assert words in error.details(), error.details()
            assert "/tmp" not in error.details()  # no path of the server's
        after = await ops.model_info()
        assert (await answer(ops, "a1")).text == a1.text
    assert list(after.adapters) == list(before.adapters)
    metrics = await scrape(adapters_server.metrics_url)
    assert metrics.value("mmgate_adapter_loads_total", outcome="refused") >= len(REFUSED_LOADS)


async def test_a_reload_under_the_same_name_answers_anew(
    adapters_server: RunningServer, root: Path
) -> None:
    cached = {"cache_policy": "response"}
    async with caller(adapters_server, "ops") as ops:
        first = await ops.load_adapter("swap", "a1")
        same = await ops.load_adapter("swap", str(root / "a1"))  # the same bytes: no change
        a1 = await answer(ops, "a1")
        old = await answer(ops, "swap", **cached)
        again = await answer(ops, "swap", **cached)
        second = await ops.load_adapter("swap", str(root / "a3"))
        new = await answer(ops, "swap", **cached)
        await ops.load_adapter("a3", "a3")
        a3 = await answer(ops, "a3")
        assert await ops.unload_adapter("swap") == 0
        assert await ops.unload_adapter("a3") == 0
        gone = await refused(answer(ops, "swap"))
    assert (first.replaced, same.replaced, second.replaced) == (False, False, True)
    assert same.adapter == first.adapter
    assert first.adapter.digest != second.adapter.digest
    assert old.text == a1.text
    assert again.final.cache.response_from_cache
    # the same name, the same prompt and policy: a key by name alone would replay the old answer
    assert not new.final.cache.response_from_cache
    assert new.text == a3.text != old.text
    assert gone.code() == grpc.StatusCode.NOT_FOUND


async def test_an_unload_lets_running_requests_finish(adapters_server: RunningServer) -> None:
    async with caller(adapters_server, "ops") as ops:
        await ops.load_adapter("draining", "a2")
        request = pb.GenerateRequest(
            prompt=QUESTION,
            adapter="draining",
            sampling=pb.SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True),
        )
        stream = ops.generate(request)
        first = await anext(stream)  # the run has started
        assert first.HasField("delta")
        assert await ops.unload_adapter("draining") == 1
        rest = [message async for message in stream]
        late = await refused(answer(ops, "draining"))
    final = rest[-1].final
    assert final.usage.completion_tokens == 48
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert late.code() == grpc.StatusCode.NOT_FOUND


async def test_the_prefix_cache_keeps_adapters_and_tenants_apart(
    adapters_server: RunningServer,
) -> None:
    # more than one KV block (128 tokens on the CPU) of one prompt
    prompt = "Here is a list of European capitals and their countries. " * 16
    once: dict[str, Any] = {
        "max_tokens": 1,
        "temperature": 0.0,
        "cache_policy": "bypass",
        "raw": True,
    }

    async def cached(client: MmgateClient, adapter: str) -> int:
        response = await client.complete(prompt, adapter=adapter, **once)
        return response.final.usage.cached_prompt_tokens

    async with caller(adapters_server, "alpha") as alpha, caller(adapters_server, "beta") as beta:
        assert await cached(alpha, "a1") == 0
        assert await cached(alpha, "a1") >= 128  # the same adapter: its blocks
        assert await cached(alpha, "a2") == 0  # another adapter: none of a1's
        assert await cached(alpha, "") == 0  # the base model: none of an adapter's
        assert await cached(beta, "a2") == 0  # the same adapter, another tenant: none
