"""Tenants kept apart at every cache level, probed from outside as tenant beta probing alpha:
mmgate's own stages (in memory and in Redis), every Cache RPC, shared responses, and vLLM's own
caches (prefix, processor), by what the responses say and by how long they take."""

from __future__ import annotations

import io
import random
import statistics
import time
from typing import Any

import grpc
import pytest
from PIL import Image

from services.client import MmgateClient, error_reason
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.redis_support import RedisProcess
from tests.services.auth.support import Pki, as_tenant, refused
from tests.services.imagegen import png
from tests.services.prom import scrape
from tests.support import RunningServer, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")


# a shared response, short and repeatable
SHARED_RESPONSE: dict[str, Any] = {
    "max_tokens": 4,
    "temperature": 0.0,
    "cache_policy": "response",
    "raw": True,
}


def tenant(server: RunningServer, pki: Pki, name: str) -> MmgateClient:
    return MmgateClient(server.target, credentials=as_tenant(pki, name), timeout=120.0)


def photo(seed: int, side: int = 2400) -> bytes:
    """A JPEG of a realistic size whose decode costs what a photo's does (~tens of ms)."""
    rng = random.Random(seed)
    small = Image.frombytes("RGB", (48, 48), rng.randbytes(48 * 48 * 3))
    image = small.resize((side, side), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


async def test_every_cache_rpc_keeps_tenants_apart(token_server: RunningServer, pki: Pki) -> None:
    image = png(1301)
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
        tenant(token_server, pki, "ops") as ops,
    ):
        held = await alpha.prefetch(image)
        assert held.outcome == "miss"
        assert (await alpha.inspect(digest=held.digest)).state == "stored"
        key = (await alpha.inspect(digest=held.digest)).stages[0].key

        # beta: alpha's image is not there, by digest or by key
        assert (await beta.inspect(digest=held.digest)).state == "absent"
        assert (await beta.inspect(key)).state == "absent"
        # naming alpha: NOT_FOUND, the same answer as for an entry alpha does not hold
        for digest in (held.digest, "sha256:" + "1" * 64):
            error = await refused(beta.inspect(digest=digest, tenant="alpha"))
            assert error.code() == grpc.StatusCode.NOT_FOUND
            assert error_reason(error) == "ENTRY_NOT_FOUND"
            error = await refused(beta.invalidate(digest=digest, tenant="alpha"))
            assert error.code() == grpc.StatusCode.NOT_FOUND
        # invalidating "its own" copy removes nothing of alpha's
        assert not await beta.invalidate(digest=held.digest)
        assert not await beta.invalidate(key)
        assert (await alpha.inspect(digest=held.digest)).state == "stored"
        # referring to alpha's digest without the bytes: beta does not hold it
        by_digest = pb.GenerateRequest(
            prompt="<image> what?",
            images=[pb.Image(digest=held.digest)],
            sampling=pb.SamplingParams(max_tokens=1),
        )
        error = await refused(beta.inference.Complete(by_digest, metadata=beta.metadata))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error_reason(error) == "IMAGE_NOT_FOUND"
        # prefetching the same bytes is a miss for beta: decoded again, in its own namespace
        assert (await beta.prefetch(image)).outcome == "miss"

        # stats: each tenant its own figures; all tenants is an admin's
        mine = await alpha.stats()
        assert [t.tenant for t in mine.tenants] == ["alpha"]
        assert mine.tenants[0].entries >= 1
        assert not mine.HasField("actor")  # all tenants together: an admin's only
        error = await refused(beta.stats(all_tenants=True))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_reason(error) == "ADMIN_ONLY"
        every = await ops.stats(all_tenants=True)
        assert {"alpha", "beta"} <= {t.tenant for t in every.tenants}
        assert every.HasField("actor")
        assert every.actor.entries >= 2

        # an admin sees and may invalidate any tenant's entry
        assert (await ops.inspect(digest=held.digest, tenant="alpha")).state == "stored"
        assert await ops.invalidate(digest=held.digest, tenant="alpha")
        assert (await alpha.inspect(digest=held.digest)).state == "absent"
        assert (await beta.inspect(digest=held.digest)).state == "stored"  # beta's own copy


async def test_shared_responses_and_redis_entries_are_per_tenant(
    token_server: RunningServer, pki: Pki, tenants_redis: RedisProcess
) -> None:
    prompt = "Shared answer for the isolation test, number 7741."
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
    ):
        first = await alpha.complete(prompt, **SHARED_RESPONSE)
        again = await alpha.complete(prompt, **SHARED_RESPONSE)
        assert again.final.cache.response_from_cache  # the probe sees a shared response...
        theirs = await beta.complete(prompt, **SHARED_RESPONSE)
        assert not theirs.final.cache.response_from_cache  # ...and beta does not get alpha's
        assert theirs.text == first.text

    # in Redis too, each tenant's entries under its own name (written back after the answer)
    async def both_written() -> bool:
        keys = tenants_redis.cli("--scan", "--pattern", "mmgate:*").split()
        return {"alpha", "beta"} <= {key.split(":")[2] for key in keys}

    await eventually(both_written, timeout=10)


async def test_alphas_response_copied_under_betas_key_in_redis_is_never_served(
    token_server: RunningServer, pki: Pki, tenants_redis: RedisProcess
) -> None:
    # whoever can write to Redis copies alpha's valid value onto the key beta's same prompt
    # reads (a text prompt's response key differs by tenant in its prefix only)
    prompt = "An answer alpha paid for, number 5520."

    def alphas() -> list[str]:
        keys = tenants_redis.cli("--scan", "--pattern", "mmgate:*:alpha:response:*").split()
        return sorted(keys)

    before = set(alphas())
    async with tenant(token_server, pki, "alpha") as alpha:
        await alpha.complete(prompt, **SHARED_RESPONSE)

    async def written() -> bool:
        return bool(set(alphas()) - before)

    await eventually(written, timeout=10)
    (source,) = set(alphas()) - before
    target = source.replace(":alpha:response:", ":beta:response:")
    assert tenants_redis.cli("COPY", source, target, "REPLACE") == "1"
    refused_before = (await scrape(token_server.metrics_url)).value(
        "mmgate_tier_refused_values_total"
    )
    async with tenant(token_server, pki, "beta") as beta:
        theirs = await beta.complete(prompt, **SHARED_RESPONSE)
    assert not theirs.final.cache.response_from_cache  # computed for beta, not alpha's served
    lookups = {(up.stage, up.outcome, up.tier) for up in theirs.final.cache.lookups}
    assert ("response", "miss", "redis") not in lookups
    refused = (await scrape(token_server.metrics_url)).value("mmgate_tier_refused_values_total")
    assert refused == refused_before + 1


async def test_beta_gets_no_cached_prefix_of_alphas_prompt(
    token_server: RunningServer, pki: Pki
) -> None:
    secret = " ".join(f"confidential clause {i} of the alpha merger terms;" for i in range(60))
    guess = secret[: len(secret) // 2 + 40] + " and then something else entirely"
    options: dict[str, Any] = {
        "max_tokens": 1,
        "temperature": 0.0,
        "raw": True,
        "cache_policy": "bypass",
    }
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
    ):
        await alpha.complete(secret, **options)
        own = await alpha.complete(guess, **options)
        # the probe can see a hit: alpha's own guess shares its cached blocks
        assert own.final.usage.cached_prompt_tokens >= 128, own.final.usage
        theirs = await beta.complete(guess, **options)
        assert theirs.final.usage.cached_prompt_tokens == 0, theirs.final.usage
        assert theirs.final.usage.prompt_tokens == own.final.usage.prompt_tokens


async def test_beta_cannot_time_probe_alphas_images(token_server: RunningServer, pki: Pki) -> None:
    """With vLLM's caches live (pixels mode): beta's latency on an image alpha sent is that of
    an image nobody sent; alpha's own repeat is measurably faster, so the probe can see a hit."""
    # medians of 11: on a 2-vCPU host busy with the rest of the suite, 7 left a median within
    # reach of one stalled request (a fresh/alpha's difference of 19 ms against a 40 ms gap)
    rounds = 11
    # longer than one KV block with the image: a repeat can hit vLLM's prefix cache too
    question = "<image> " + " ".join(f"Describe detail {i} of the picture." for i in range(40))
    options: dict[str, Any] = {
        "max_tokens": 1,
        "temperature": 0.0,
        "raw": True,
        "cache_policy": "bypass",
    }
    alphas = [photo(5000 + i) for i in range(rounds)]
    fresh = [photo(6000 + i) for i in range(rounds)]
    timings: dict[str, list[float]] = {"alpha repeat": [], "beta on alpha's": [], "beta fresh": []}
    reports: dict[str, list[object]] = {name: [] for name in timings}

    async def timed(client: MmgateClient, image: bytes, name: str) -> None:
        started = time.perf_counter()
        response = await client.complete(question, images=[image], **options)
        timings[name].append(time.perf_counter() - started)
        reports[name].append(response.final)

    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
    ):
        # warm-up: both tenants' paths, and each image of alpha's held by alpha
        await timed(beta, photo(7000), "beta fresh")
        for image in alphas:
            await alpha.complete(question, images=[image], **options)
        for name in timings:
            timings[name].clear()
            reports[name].clear()
        for i in range(rounds):
            # interleaved, so drift on a shared machine falls on all three alike
            await timed(alpha, alphas[i], "alpha repeat")
            await timed(beta, alphas[i], "beta on alpha's")
            await timed(beta, fresh[i], "beta fresh")

    medians = {name: statistics.median(values) for name, values in timings.items()}
    gap = medians["beta fresh"] - medians["alpha repeat"]
    summary = {name: f"{value * 1000:.1f} ms" for name, value in medians.items()}
    print("timing probe medians:", summary)  # the figures docs/security.md cites
    # a hit is distinguishable: alpha's repeat is clearly faster than an image nobody sent
    assert gap > 0.25 * medians["beta fresh"], summary
    # beta on alpha's image is indistinguishable from a fresh one: nearer fresh than hit
    assert abs(medians["beta on alpha's"] - medians["beta fresh"]) < 0.35 * gap, summary
    for final in reports["beta on alpha's"]:
        assert final.cache.images[0].outcome == "miss"  # type: ignore[attr-defined]
        assert final.usage.cached_prompt_tokens == 0  # type: ignore[attr-defined]
    for final in reports["alpha repeat"]:
        assert final.cache.images[0].outcome == "hit"  # type: ignore[attr-defined]
        assert final.usage.cached_prompt_tokens > 0  # type: ignore[attr-defined]
