"""Hostile input: a corpus of crafted requests (corpus.py), then requests and raw bytes made by
hypothesis. Each gets its documented status in mmgate's own words (never UNKNOWN or INTERNAL,
never a class name, address or stack hint), and the server answers the next valid request."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable

import grpc
from google.rpc import error_details_pb2, status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.client import SyncClient
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.support import RunningServer

from .conftest import record, scaled
from .corpus import CASES, DOCUMENTED, LEAKS, MAX_DETAILS, REF_CYCLE, URLS

COMPLETE = "/mmgate.v1.Inference/Complete"
# and an image URL the address guard refuses (the generated ones name loopback and private hosts)
GENERATED_DOCUMENTED = DOCUMENTED | {"PERMISSION_DENIED"}


def outcome(call: Callable[[], object]) -> tuple[str, str, set[str]]:
    """(status code, details, fields a BadRequest names) of one call."""
    try:
        call()
    except grpc.RpcError as error:
        fields: set[str] = set()
        for key, value in error.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = status_pb2.Status.FromString(value)
                for detail in status.details:
                    bad = error_details_pb2.BadRequest()
                    if detail.Unpack(bad):
                        fields |= {v.field for v in bad.field_violations}
        return str(error.code().name), str(error.details() or ""), fields
    return "OK", "", set()


def send(client: SyncClient, make: Callable[[], pb.GenerateRequest]) -> object:
    return client.complete_request(make())


def still_serving(client: SyncClient) -> None:
    assert client.complete("Hi", max_tokens=1).final.usage.completion_tokens == 1


GENERATED: Counter[str] = Counter()
# parentheses nested up to 40,000 deep: the depth that overflowed a native compiler's stack
nested = st.integers(1, 40_000).map(lambda depth: "(" * depth + "a" + ")" * depth)
# image URLs: malformed, refused by the address guard, or of a scheme not allowed; never a name
# to resolve (this machine may have no resolver that answers)
urls = st.one_of(
    st.sampled_from(URLS),
    st.text(max_size=30).map(lambda path: f"https://127.0.0.1/{path}"),
    st.text(max_size=30).map(lambda path: f"https://10.1.2.3/{path}"),
)
images = st.one_of(
    st.binary(max_size=300).map(lambda raw: pb.Image(data=raw)),
    urls.map(lambda url: pb.Image(url=url)),
)
floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(0, 2**32 - 1),
        "temperature": floats,
        "top_p": floats,
        "top_k": st.integers(-(2**31), 2**31 - 1),
        "seed": st.integers(-(2**63), 2**63 - 1),
        "repetition_penalty": floats,
        "min_tokens": st.integers(0, 2**32 - 1),
        "stop_token_ids": st.one_of(
            st.lists(st.integers(0, 2**32 - 1), max_size=70),
            st.integers(0, 300_000).map(lambda count: [0] * count),  # counted before it is built
        ),
        "stop": st.one_of(
            st.lists(st.text(max_size=6), max_size=20),
            st.integers(0, 300_000).map(lambda count: [""] * count),
        ),
        "include_stop_str_in_output": st.booleans(),
        "skip_special_tokens": st.booleans(),
        "logit_bias": st.dictionaries(st.integers(0, 2**32 - 1), floats, max_size=5),
        "truncate_prompt_tokens": st.integers(0, 2**32 - 1),
        # one of the constraint's fields at most: the message keeps the last set
        "json_schema": st.one_of(
            st.text(max_size=120),
            st.sampled_from(['{"type":"object"}', '{"type":"integer","maximum":9}', "{}"]),
            st.sampled_from([json.dumps(REF_CYCLE), '{"$ref": "#"}', '{"items": {"$ref": "#"}}']),
            nested.map(lambda groups: json.dumps({"type": "string", "pattern": groups})),
            st.integers(1, 6000).map(lambda depth: '{"items":' * depth + "{}" + "}" * depth),
        ),
        # no digits: a repetition count ({900}) makes a grammar the engine compiles for
        # seconds, and goes on compiling after the call has ended (docs/service.md)
        "regex": st.one_of(
            st.text(st.characters(blacklist_categories=["Nd"]), max_size=40), nested
        ),
        "grammar": st.one_of(
            st.text(st.characters(blacklist_categories=["Nd"]), max_size=60),
            nested.map(lambda groups: "root ::= " + groups.replace("a", '"a"')),
        ),
        "choice": st.builds(pb.Choices, choices=st.lists(st.text(max_size=8), max_size=4)),
        "json_object": st.booleans(),
        "n": st.integers(0, 2**32 - 1),
        "logprobs": st.integers(0, 2**32 - 1),
        "prompt_logprobs": st.integers(0, 2**32 - 1),
    },
)


# tools: names, schemas and choices of every shape, and turns that make and answer calls
schemas = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "",
            "{}",
            '{"type":"object"}',
            '{"type":"array"}',
            json.dumps({"type": "object", **REF_CYCLE}),
        ]
    ),
    st.integers(1, 3000).map(
        lambda depth: (
            '{"type":"object","properties":{"a":' + '{"items":' * depth + "{}" + "}" * (depth + 2)
        )
    ),
)
tool_names = st.one_of(st.sampled_from(["get_weather", "t", ""]), st.text(max_size=70))
calls = st.builds(
    pb.ToolCall, id=st.text(max_size=10), name=tool_names, arguments=st.text(max_size=40)
)
turns = st.builds(
    pb.ChatMessage,
    role=st.sampled_from(["user", "assistant", "tool", "system", "robot"]),
    content=st.text(max_size=40),
    tool_call_id=st.text(max_size=10),
    tool_calls=st.lists(calls, max_size=3),
)
chats = st.builds(
    pb.Chat,
    messages=st.lists(turns, min_size=1, max_size=4),
    tools=st.lists(
        st.builds(pb.Tool, name=tool_names, description=st.text(max_size=20), parameters=schemas),
        max_size=4,
    ),
    tool_choice=st.one_of(
        st.builds(pb.ToolChoice, mode=st.integers(0, 5)),
        st.builds(pb.ToolChoice, function=tool_names),
    ),
    parallel_tool_calls=st.booleans(),
)


def generated(
    prompt: str | list[int] | pb.Chat,
    values: dict[str, object],
    images: list[pb.Image],
    request_id: str,
    policy: int,
    adapter: str,
) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        sampling=pb.SamplingParams(**values),  # type: ignore[arg-type]
        images=images,
        request_id=request_id,
        cache_policy=policy,  # type: ignore[arg-type]
        adapter=adapter,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    elif isinstance(prompt, pb.Chat):
        request.chat.CopyFrom(prompt)
    else:
        request.token_ids.ids.extend(prompt)
    return request


requests = st.builds(
    generated,
    st.one_of(st.text(max_size=200), st.lists(st.integers(0, 2**32 - 1), max_size=20), chats),
    sampling,
    st.lists(images, max_size=3),
    st.text(max_size=40),
    st.integers(0, 5),
    st.one_of(st.just(""), st.text(max_size=70)),
)


@settings(
    max_examples=scaled(120, 3000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=st.one_of(requests.map(lambda m: m.SerializeToString()), st.binary(max_size=400)))
def test_generated_messages_and_bytes(llava_server: RunningServer, message: bytes) -> None:
    with SyncClient(llava_server.target, timeout=60) as client:
        raw = client.channel.unary_unary(COMPLETE)
        code, details, _ = outcome(lambda: raw(message, timeout=30))
        GENERATED[code] += 1
        assert code in GENERATED_DOCUMENTED, (code, details, message[:80])
        assert not LEAKS.search(details), (details, message[:80])
        still_serving(client)


def test_the_corpus_gets_its_documented_statuses(llava_server: RunningServer) -> None:
    results = []
    with SyncClient(llava_server.target, timeout=60) as client:
        raw = client.channel.unary_unary(COMPLETE)
        for name, (make, expected, field) in CASES.items():
            code, details, fields = outcome(functools.partial(send, client, make))
            results.append({"name": name, "code": code, "field": field, "details": details})
            assert code == expected, (name, code, details[:300])
            assert len(details) <= MAX_DETAILS, (name, len(details))
            assert field is None or field in fields, (name, fields)
            assert not LEAKS.search(details), (name, details)
            still_serving(client)
        for name, payload in (("corrupt wire bytes", b"\x0a\xff\x01abc"),
                              ("invalid UTF-8 in a string", b"\x0a\x02\xff\xfe")):  # fmt: skip
            code, details, _ = outcome(functools.partial(raw, payload, timeout=30))
            results.append({"name": name, "code": code, "field": None, "details": details})
            assert code == "INVALID_ARGUMENT", (name, code, details)
            still_serving(client)
    # the generated test ran first (file order): its counts go in the same record
    generated = GENERATED
    record(
        "hostile",
        {
            "cases": results,
            "generated": sum(generated.values()),
            "generated_codes": dict(sorted(generated.items())),
        },
    )
