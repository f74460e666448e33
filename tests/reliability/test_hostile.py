"""Hostile input: a corpus of crafted requests, then requests and raw bytes made by hypothesis.
Each gets its documented status in mmgate's own words (never UNKNOWN or INTERNAL, never a class
name, address or stack hint), and the server answers the next valid request."""

from __future__ import annotations

import functools
import io
import json
import re
import struct
import zlib
from collections import Counter
from collections.abc import Callable

import grpc
from google.rpc import error_details_pb2, status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from services.client import SyncClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.imagegen import _chunk, corrupt_png, encoded, picture, png, png_bomb
from tests.support import RunningServer

from .conftest import record, scaled

MiB = 1024 * 1024
DOCUMENTED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}
# what must never reach a client: class names, heap addresses, stack hints
LEAKS = re.compile(
    r"Error\b|Exception|0x[0-9a-f]{6,}|Traceback|File \"|stack trace|Plugin|\b[A-Z]+_[A-Z_]+\b"
)
COMPLETE = "/mmgate.v1.Inference/Complete"
DEEP_GROUPS = "(" * 30_000 + "a" + ")" * 30_000
REF_CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
# a refusal's message: bounded whatever the request holds (gRPC carries 8 KiB of metadata)
MAX_DETAILS = 4096


def ask(*images: pb.Image, **sampling: object) -> pb.GenerateRequest:
    options = {"max_tokens": 2, **sampling}
    request = build_request("What is in the picture?", **options)  # type: ignore[arg-type]
    request.ClearField("images")
    request.images.extend(images)
    if images:
        request.chat.messages[0].content = "<image>" * len(images) + " What is in it?"
    return request


def data(raw: bytes, mime_type: str = "") -> pb.Image:
    return pb.Image(data=raw, mime_type=mime_type)


def truncated(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def zlib_text_bomb() -> bytes:
    """A valid small PNG with a compressed text chunk that inflates to 64 MiB."""
    base = png(5)
    body = b"comment\x00\x00" + zlib.compress(b"\x00" * (64 * MiB), 9)
    return base[:-12] + _chunk(b"zTXt", body) + base[-12:]


def huge_dimensions() -> bytes:
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IEND", b"")


def animated(fmt: str) -> bytes:
    frames = [picture(i) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, format=fmt, save_all=True, append_images=frames[1:], duration=100)
    return out.getvalue()


def gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32)).save(out, format="GIF")
    return out.getvalue()


# name: (request, expected status, a field the BadRequest names, or None)
CASES: dict[str, tuple[Callable[[], pb.GenerateRequest], str, str | None]] = {
    "corrupt PNG": (lambda: ask(data(corrupt_png(1))), "INVALID_ARGUMENT", "images[0]"),
    "truncated PNG": (lambda: ask(data(truncated(png(2)))), "INVALID_ARGUMENT", "images[0]"),
    "corrupt JPEG": (
        lambda: ask(data(encoded(picture(3), "JPEG")[:200] + b"\x00" * 500)),
        "INVALID_ARGUMENT",
        "images[0]",
    ),
    "truncated WebP": (
        lambda: ask(data(truncated(encoded(picture(4), "WEBP")))),
        "INVALID_ARGUMENT",
        "images[0]",
    ),
    "PNG decompression bomb": (lambda: ask(data(png_bomb())), "INVALID_ARGUMENT", "images[0]"),
    "zlib text-chunk bomb": (lambda: ask(data(zlib_text_bomb())), "INVALID_ARGUMENT", "images[0]"),
    "100,000 x 100,000 pixels": (
        lambda: ask(data(huge_dimensions())),
        "INVALID_ARGUMENT",
        "images[0]",
    ),
    # an animated image is a still one to the model: its first frame
    "animated PNG": (lambda: ask(data(animated("PNG"))), "OK", None),
    "animated WebP": (lambda: ask(data(animated("WEBP"))), "OK", None),
    "GIF": (lambda: ask(data(gif())), "INVALID_ARGUMENT", "images[0]"),
    "mime type that lies": (
        lambda: ask(data(png(6), "image/jpeg")),
        "INVALID_ARGUMENT",
        "images[0]",
    ),
    "unknown digest": (
        lambda: ask(pb.Image(digest="sha256:" + "ab" * 32)),
        "NOT_FOUND",
        None,
    ),
    "unknown adapter": (
        lambda: build_request("Hi", adapter="someone-elses", max_tokens=1),
        "NOT_FOUND",
        None,
    ),
    "adapter name of 100,000 characters": (
        lambda: build_request("Hi", adapter="\n" + "x" * 100_000, max_tokens=1),
        "NOT_FOUND",
        None,
    ),
    "malformed digest": (
        lambda: ask(pb.Image(digest="sha256:" + "ab" * 32 + "\n")),
        "INVALID_ARGUMENT",
        "images[0].digest",
    ),
    "17 images": (lambda: ask(*[data(png(i)) for i in range(17)]), "INVALID_ARGUMENT", "images"),
    "max_tokens 1e9": (lambda: ask(max_tokens=10**9), "INVALID_ARGUMENT", "sampling.max_tokens"),
    "NaN temperature": (
        lambda: ask(temperature=float("nan")),
        "INVALID_ARGUMENT",
        "sampling.temperature",
    ),
    "infinite top_p": (lambda: ask(top_p=float("inf")), "INVALID_ARGUMENT", "sampling.top_p"),
    "request id with a newline": (
        lambda: build_request("Hi", request_id="abc\n", max_tokens=1),
        "INVALID_ARGUMENT",
        "request_id",
    ),
    "request id of 10,000 characters": (
        lambda: build_request("Hi", request_id="a" * 10_000, max_tokens=1),
        "INVALID_ARGUMENT",
        "request_id",
    ),
    "5 MiB message (limit 4)": (
        lambda: build_request("y" * (5 * MiB), max_tokens=1),
        "INVALID_ARGUMENT",
        "request",
    ),
    "JSON schema of a 100,000-value enum": (
        lambda: ask(json_schema=json.dumps({"enum": list(range(100_000))})),
        "INVALID_ARGUMENT",
        "sampling.json_schema",
    ),
    "JSON schema nested 5,000 deep": (
        lambda: ask(json_schema='{"items":' * 5000 + "{}" + "}" * 5000),
        "INVALID_ARGUMENT",
        "sampling.json_schema",
    ),
    "JSON schema of an unknown type": (
        lambda: ask(json_schema='{"type": "colour"}'),
        "INVALID_ARGUMENT",
        "sampling.json_schema",
    ),
    "regex that does not parse": (
        lambda: ask(regex="([a-z]+"),
        "INVALID_ARGUMENT",
        "sampling.regex",
    ),
    "grammar naming a rule it lacks": (
        lambda: ask(grammar="root ::= missing"),
        "INVALID_ARGUMENT",
        "sampling.grammar",
    ),
    "json_object set to false": (
        lambda: ask(json_object=False),
        "INVALID_ARGUMENT",
        "sampling.json_object",
    ),
    "choice of 5,000 strings": (
        lambda: ask(choice=[str(i) for i in range(5000)]),
        "INVALID_ARGUMENT",
        "sampling.choice.choices",
    ),
    "zero samples": (lambda: ask(n=0, temperature=1.0), "INVALID_ARGUMENT", "sampling.n"),
    "4 billion samples": (lambda: ask(n=2**32 - 1), "INVALID_ARGUMENT", "sampling.n"),
    "two greedy samples": (
        lambda: ask(n=2, temperature=0.0),
        "INVALID_ARGUMENT",
        "sampling.n",
    ),
    "21 alternatives per token": (
        lambda: ask(logprobs=21),
        "INVALID_ARGUMENT",
        "sampling.logprobs",
    ),
    "2**31 alternatives per prompt token": (
        lambda: ask(prompt_logprobs=2**31),
        "INVALID_ARGUMENT",
        "sampling.prompt_logprobs",
    ),
    "empty token ids": (
        lambda: build_request(token_ids=[], max_tokens=1),
        "INVALID_ARGUMENT",
        "token_ids.ids",
    ),
    "a token id past the vocabulary": (
        lambda: build_request(token_ids=[1, 2, 3, 2**32 - 1], max_tokens=1),
        "INVALID_ARGUMENT",
        "token_ids.ids[3]",
    ),
    "token ids longer than the context": (
        lambda: build_request(token_ids=[5] * 100_000, max_tokens=1),
        "INVALID_ARGUMENT",
        "token_ids.ids",
    ),
    "token ids with an image": (
        lambda: _with_image(build_request(token_ids=[5, 6], max_tokens=1)),
        "INVALID_ARGUMENT",
        "images",
    ),
    "logit bias past the vocabulary": (
        lambda: ask(logit_bias={2**31: 1.0}),
        "INVALID_ARGUMENT",
        f"sampling.logit_bias[{2**31}]",
    ),
    # nesting that overflowed xgrammar's native stack and killed the server (SIGSEGV)
    "JSON schema pattern of 30,000 nested groups": (
        lambda: ask(json_schema=json.dumps({"type": "string", "pattern": DEEP_GROUPS})),
        "INVALID_ARGUMENT",
        "sampling.json_schema",
    ),
    "regex of 30,000 nested groups": (
        lambda: ask(regex=DEEP_GROUPS),
        "INVALID_ARGUMENT",
        "sampling.regex",
    ),
    "grammar of 30,000 nested groups": (
        lambda: ask(grammar="root ::= " + DEEP_GROUPS.replace("a", '"a"')),
        "INVALID_ARGUMENT",
        "sampling.grammar",
    ),
    "JSON schema nested 200 deep": (
        lambda: ask(json_schema='{"items":' * 200 + "{}" + "}" * 200),
        "INVALID_ARGUMENT",
        "sampling.json_schema",
    ),
    # a grammar no finite text completes: the engine rejected every token, the call ended OK
    # with no text and no reason
    "JSON schema $ref cycle": (
        lambda: ask(json_schema=json.dumps(REF_CYCLE)),
        "INVALID_ARGUMENT",
        "sampling.json_schema",
    ),
    # repeated fields counted before anything is built: a 54 MB refusal once held the loop 7.9 s
    "1,000,000 empty stop strings": (
        lambda: ask(stop=[""] * 1_000_000),
        "INVALID_ARGUMENT",
        "sampling.stop",
    ),
    "1,000 empty stop strings": (
        lambda: ask(stop=[""] * 1_000),
        "INVALID_ARGUMENT",
        "sampling.stop",
    ),
    # 3,000,000 fit the default 32 MiB limit (tests/services/api/test_hostile_bounds.py); this
    # server takes 4 MiB
    "chat of 300,000 messages": (
        lambda: many_messages(300_000),
        "INVALID_ARGUMENT",
        "chat.messages",
    ),
    "unclosed IPv6 URL": (
        lambda: ask(pb.Image(url="http://[::1/x.png")),
        "INVALID_ARGUMENT",
        "images[0].url",
    ),
    "IPv6 URL that is no address": (
        lambda: ask(pb.Image(url="http://[abc]/x.png")),
        "INVALID_ARGUMENT",
        "images[0].url",
    ),
    "URL with an empty label": (
        lambda: ask(pb.Image(url="http://a..b/x.png")),
        "INVALID_ARGUMENT",
        "images[0].url",
    ),
    "URL with a 64-character label": (
        lambda: ask(pb.Image(url=f"http://{'a' * 64}.example/x.png")),
        "INVALID_ARGUMENT",
        "images[0].url",
    ),
    "9 MiB message (twice the limit)": (
        lambda: build_request("z" * (9 * MiB), max_tokens=1),
        "RESOURCE_EXHAUSTED",
        None,
    ),
}


def many_messages(count: int) -> pb.GenerateRequest:
    """A chat of ``count`` messages, made from the wire bytes of one (fast to build)."""
    one = pb.Chat(messages=[pb.ChatMessage(role="user", content="hi")]).SerializeToString()
    return pb.GenerateRequest(chat=pb.Chat.FromString(one * count))


def _with_image(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.images.append(data(png(7)))
    return request


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
        "stop_token_ids": st.lists(st.integers(0, 2**32 - 1), max_size=70),
        "include_stop_str_in_output": st.booleans(),
        "skip_special_tokens": st.booleans(),
        "logit_bias": st.dictionaries(st.integers(0, 2**32 - 1), floats, max_size=5),
        "truncate_prompt_tokens": st.integers(0, 2**32 - 1),
        # one of the constraint's fields at most: the message keeps the last set
        "json_schema": st.one_of(
            st.text(max_size=120),
            st.sampled_from(['{"type":"object"}', '{"type":"integer","maximum":9}', "{}"]),
        ),
        # no digits: a repetition count ({900}) makes a grammar the engine compiles for
        # seconds, and goes on compiling after the call has ended (docs/service.md)
        "regex": st.text(st.characters(blacklist_categories=["Nd"]), max_size=40),
        "grammar": st.text(st.characters(blacklist_categories=["Nd"]), max_size=60),
        "choice": st.builds(pb.Choices, choices=st.lists(st.text(max_size=8), max_size=4)),
        "json_object": st.booleans(),
        "n": st.integers(0, 2**32 - 1),
        "logprobs": st.integers(0, 2**32 - 1),
        "prompt_logprobs": st.integers(0, 2**32 - 1),
    },
)


def generated(
    prompt: str | list[int],
    values: dict[str, object],
    images: list[bytes],
    request_id: str,
    policy: int,
    adapter: str,
) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        sampling=pb.SamplingParams(**values),  # type: ignore[arg-type]
        images=[pb.Image(data=image) for image in images],
        request_id=request_id,
        cache_policy=policy,  # type: ignore[arg-type]
        adapter=adapter,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.token_ids.ids.extend(prompt)
    return request


requests = st.builds(
    generated,
    st.one_of(st.text(max_size=200), st.lists(st.integers(0, 2**32 - 1), max_size=20)),
    sampling,
    st.lists(st.binary(max_size=300), max_size=3),
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
        assert code in DOCUMENTED, (code, details, message[:80])
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
