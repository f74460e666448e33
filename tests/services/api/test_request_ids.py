"""A caller's request_id is a label: two callers sending the same id (here from two tenants) get
engine requests of their own, and cancelling one never touches the other (real engine)."""

import asyncio

from services.client import build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.support import RunningServer

MAX_TOKENS = 900


async def test_the_same_request_id_never_shares_an_engine_request(server: RunningServer) -> None:
    request = build_request(
        "Tell me a long story", max_tokens=MAX_TOKENS, ignore_eos=True, request_id="shared-id"
    )
    async with (
        server.client(tenant="team-a", timeout=60.0) as a,
        server.client(tenant="team-b", timeout=60.0) as b,
    ):
        for _ in range(3):  # the collision aborted the other request in 3 of 5 tries
            leaving, staying = a.generate(request), b.generate(request)
            await asyncio.gather(anext(leaving), anext(staying))  # both in progress
            await leaving.aclose()  # cancels team-a's call, and with it its engine request
            events = [event async for event in staying]
            final = events[-1].final
            assert final.request_id == "shared-id"  # the caller's label, as it sent it
            assert final.finish_reason == pb.FINISH_REASON_LENGTH
            # the first delta was read above: every token of the rest arrived
            assert final.usage.completion_tokens == MAX_TOKENS
