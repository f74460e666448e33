"""The hostile corpus: crafted requests, each with the status mmgate documents for it and the
field its refusal names (tests/reliability/test_hostile.py sends each alone, the chaos run sends
them beside its load)."""

from __future__ import annotations

import io
import json
import re
import struct
import zlib
from collections.abc import Callable

from PIL import Image

from services.client import build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.imagegen import _chunk, corrupt_png, encoded, picture, png, png_bomb

MiB = 1024 * 1024
DOCUMENTED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}
# what must never reach a client: class names, heap addresses, stack hints
LEAKS = re.compile(
    r"Error\b|Exception|0x[0-9a-f]{6,}|Traceback|File \"|stack trace|Plugin|\b[A-Z]+_[A-Z_]+\b"
)
DEEP_GROUPS = "(" * 30_000 + "a" + ")" * 30_000
REF_CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
# image URLs that do not parse, each refused in mmgate's words (INVALID_ARGUMENT)
URLS = [
    "http://[::1/x.png",
    "http://[abc]/x.png",
    "http://a..b/x.png",
    f"http://{'a' * 64}.example/x.png",
    "https://[::1/x.png",
    "https://user:pass@/x.png",
    "https://:0/x.png",
    "file:///etc/passwd",
    "https://127.0.0.1:99999/x.png",
    "",
]
DEEP_SCHEMA = '{"type":"object","properties":{"a":' + '{"items":' * 6000 + "{}" + "}" * 6002
BACKTRACKING_SCHEMA = json.dumps(
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)+$"}}}
)
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
        lambda: with_image(build_request(token_ids=[5, 6], max_tokens=1)),
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
    "300,000 tools": (lambda: many_tools(300_000), "INVALID_ARGUMENT", "chat.tools"),
    "300,000 tool calls in one turn": (
        lambda: many_calls(300_000),
        "INVALID_ARGUMENT",
        "chat.messages",
    ),
    "a tool schema nested 6,000 deep": (
        lambda: with_tools(pb.Tool(name="t", parameters=DEEP_SCHEMA)),
        "INVALID_ARGUMENT",
        "chat.tools[0].parameters",
    ),
    "a tool schema with no end": (
        lambda: with_tools(
            pb.Tool(name="t", parameters=json.dumps({"type": "object", **REF_CYCLE}))
        ),
        "INVALID_ARGUMENT",
        "chat.tools[0].parameters",
    ),
    "a tool schema that is no JSON Schema": (
        lambda: with_tools(pb.Tool(name="t", parameters='{"type": "object", "required": 3}')),
        "INVALID_ARGUMENT",
        "chat.tools[0].parameters",
    ),
    "two tools of one name": (
        lambda: with_tools(pb.Tool(name="t"), pb.Tool(name="t")),
        "INVALID_ARGUMENT",
        "chat.tools[1].name",
    ),
    "a named function not among the tools": (
        lambda: with_tools(pb.Tool(name="t"), choice=pb.ToolChoice(function="u")),
        "INVALID_ARGUMENT",
        "chat.tool_choice.function",
    ),
    "a tool turn answering no call": (
        lambda: with_tools(
            pb.Tool(name="t"),
            turns=[pb.ChatMessage(role="tool", content="42", tool_call_id="call-1")],
        ),
        "INVALID_ARGUMENT",
        "chat.messages[1].tool_call_id",
    ),
    "call arguments nested 100,000 deep": (
        lambda: with_tools(
            pb.Tool(name="t"),
            turns=[
                pb.ChatMessage(
                    role="assistant",
                    tool_calls=[pb.ToolCall(id="c", name="t", arguments="[" * 100_000)],
                )
            ],
        ),
        "INVALID_ARGUMENT",
        "chat.messages[1].tool_calls[0].arguments",
    ),
    # a pattern that backtracks without end: the engine's grammar takes it, mmgate's check of
    # the calls bounds its match in time; the answer is calls, or text saying why not
    "a required call under a pattern that backtracks": (
        lambda: with_tools(
            pb.Tool(name="t", parameters=BACKTRACKING_SCHEMA),
            choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
        ),
        "OK",
        None,
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


def with_tools(
    *tools: pb.Tool,
    choice: pb.ToolChoice | None = None,
    turns: list[pb.ChatMessage] | None = None,
) -> pb.GenerateRequest:
    request = build_request("Call a tool.", max_tokens=16, tools=tools)
    request.chat.messages.extend(turns or [])
    if choice is not None:
        request.chat.tool_choice.CopyFrom(choice)
    return request


def many_tools(count: int) -> pb.GenerateRequest:
    """A chat with ``count`` tools, made from the wire bytes of one."""
    one = pb.Chat(tools=[pb.Tool(name="t")]).SerializeToString()
    request = build_request("Call a tool.", max_tokens=1)
    request.chat.MergeFrom(pb.Chat.FromString(one * count))
    return request


def many_calls(count: int) -> pb.GenerateRequest:
    """An assistant turn of ``count`` calls, made from the wire bytes of one."""
    one = pb.ChatMessage(tool_calls=[pb.ToolCall(id="c", name="t")]).SerializeToString()
    turn = pb.ChatMessage.FromString(one * count)
    turn.role = "assistant"
    return with_tools(pb.Tool(name="t"), turns=[turn])


def with_image(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.images.append(data(png(7)))
    return request
