"""The order of a call's end: its admission is released before its final message goes out.

A caller that sends its next request the moment it has an answer must not be refused because the
server still counts the answered call against the tenant's share (TENANT_OVERLOADED). Stand-ins
for the pipeline and the call's context; the real server's shares are tested in
tests/services/auth/test_quotas.py and tests/services/api/test_fair_shares.py.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from services.api.admission import Admission
from services.api.auth import Caller
from services.api.auth.gate import _CALLER
from services.api.inference import InferenceServicer
from services.api.quotas import TenantQuotas
from services.config import Settings
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.types import EngineDelta, Finished

pytestmark = pytest.mark.asyncio


def finished() -> Finished:
    return Finished("r1", "tiny", "length", 3, 2, 0, False, (), ())


class Context:
    def time_remaining(self) -> float:
        return 30.0

    def invocation_metadata(self) -> tuple[()]:
        return ()


def servicer(admission: Admission, events: list[EngineDelta | Finished]) -> InferenceServicer:
    async def generate(request: object, *, whole: bool) -> AsyncGenerator[Any, None]:
        for event in events:
            yield event

    pipeline = SimpleNamespace(
        check_ready=lambda with_images, with_videos=False: None,
        engine=SimpleNamespace(max_model_len=1024, vocab_size=None),
        media=SimpleNamespace(takes_images=False, videos=SimpleNamespace(takes_video=False)),
        request=lambda *args: object(),
        generate=generate,
    )
    ref = SimpleNamespace(get=lambda: pipeline)
    return InferenceServicer(Settings(), ref, admission, engine=None, load=None)  # type: ignore[arg-type]


async def test_the_final_message_comes_after_the_calls_share_is_released() -> None:
    settings = Settings(max_concurrent_requests=4)
    admission = Admission(4, TenantQuotas(settings, lambda: frozenset({"a", "b"})))
    events: list[EngineDelta | Finished] = [EngineDelta("Once", (7,)), EngineDelta(" upon", (8,))]
    served = servicer(admission, [*events, finished()])
    _CALLER.set(Caller("a", admin=False))
    held_at: list[tuple[str, int]] = []
    request = pb.GenerateRequest(prompt="Tell me a story")
    async for event in served._serve(request, Context()):
        held_at.append((type(event).__name__, admission.active_of("a")))
    # the deltas are sent while the call counts against the tenant's share, the final once not
    assert held_at == [("EngineDelta", 1), ("EngineDelta", 1), ("Finished", 0)]
    assert (admission.active, admission.by_tenant) == (0, {})
