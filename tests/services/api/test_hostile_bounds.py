"""Validation's bounds against one hostile request, without an engine: deep nesting in every
constraint kind, repeated fields of millions of items, schemas no finite value matches,
malformed image URLs. Each is refused in bounded time with a bounded message (the real server's
answers are tests/reliability/test_hostile.py's corpus)."""

from __future__ import annotations

import gc
import json
import time

import pytest

from services.api.nesting import grammar_depth, regex_depth, schema_depth
from services.api.schema_refs import refs_can_end
from services.api.validation import MAX_DESCRIPTION_CHARS, MAX_VIOLATIONS, validate
from services.config import Settings
from services.errors import InvalidRequest
from services.proto.mmgate.v1 import inference_pb2 as pb

SETTINGS = Settings()
MAX_MODEL_LEN = 2048
DEEP = 30_000  # the depth that killed the server in xgrammar's compiler


def refusal(request: pb.GenerateRequest, **options: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN, **options)  # type: ignore[arg-type]
    return caught.value


def constrained(**constraint: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(**constraint))  # type: ignore[arg-type]


def many_messages(count: int) -> pb.GenerateRequest:
    """A chat of ``count`` messages, made from the wire bytes of one (fast to build)."""
    one = pb.Chat(messages=[pb.ChatMessage(role="user", content="hi")]).SerializeToString()
    return pb.GenerateRequest(chat=pb.Chat.FromString(one * count))


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (constrained(regex="(" * DEEP + "a" + ")" * DEEP), "sampling.regex"),
        (constrained(regex="[a]" * 10 + "(" * 65 + ")" * 65), "sampling.regex"),
        (constrained(grammar="root ::= " + "(" * DEEP + '"a"' + ")" * DEEP), "sampling.grammar"),
        (
            constrained(
                json_schema=json.dumps({"type": "string", "pattern": "(" * DEEP + ")" * DEEP})
            ),
            "sampling.json_schema",
        ),
        (
            constrained(json_schema=json.dumps({"patternProperties": {"(" * 100 + ")" * 100: {}}})),
            "sampling.json_schema",
        ),
        (constrained(json_schema='{"items":' * 100 + "{}" + "}" * 100), "sampling.json_schema"),
        (
            constrained(
                json_schema=json.dumps(
                    {
                        "$ref": "#/$defs/a",
                        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    }
                )
            ),
            "sampling.json_schema",
        ),
        (
            constrained(
                json_schema=json.dumps(
                    {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
                )
            ),
            "sampling.json_schema",
        ),
    ],
    ids=[
        "regex 30,000 groups deep",
        "regex 65 groups deep",
        "grammar 30,000 deep",
        "schema pattern 30,000 deep",
        "schema patternProperties 100 deep",
        "schema 100 deep",
        "schema $ref cycle",
        "schema requiring itself",
    ],
)
def test_constraints_that_nest_or_never_end_are_refused(
    request_: pb.GenerateRequest, field: str
) -> None:
    assert field in {v.field for v in refusal(request_).violations}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}},
        {"anyOf": [{"$ref": "#"}, {"type": "string"}]},
        {"type": "object", "properties": {"next": {"$ref": "#"}}},  # optional: it can end
        {"type": "string", "pattern": r"^\(\d{3}\) [a-z]+(-[a-z]+)*$"},
        {"$ref": "https://example.com/schema.json"},  # the engine's to judge
    ],
)
def test_recursive_schemas_with_a_way_out_pass(schema: dict[str, object]) -> None:
    request = constrained(json_schema=json.dumps(schema))
    checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert checked.sampling.constraint is not None


def test_depths_count_what_a_compiler_recurses_on() -> None:
    assert regex_depth(r"\(\(\(a") == 0  # escaped: literals
    assert regex_depth("[(((]") == 1  # a class is one level, its contents none
    assert regex_depth("(a(b)(c))") == 2
    assert grammar_depth('root ::= "(((" (a (b))') == 2  # quoted literals do not nest
    assert schema_depth({"pattern": "((a))", "items": {"items": {}}}, 64) == 3
    chain = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}}
    assert refs_can_end({**chain, "$ref": "#/$defs/d0"})  # too long to decide: the engine's


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (
            pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(stop=[""] * 1_000_000)),
            "sampling.stop",
        ),
        (
            pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(stop=[""] * 1_000)),
            "sampling.stop",
        ),
        (many_messages(3_000_000), "chat.messages"),
        (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 2_000_000)), "token_ids.ids"),
        (
            pb.GenerateRequest(
                prompt="Hi",
                sampling=pb.SamplingParams(choice=pb.Choices(choices=["a"] * 1_000_000)),
            ),
            "sampling.choice.choices",
        ),
        (
            pb.GenerateRequest(
                prompt="Hi", sampling=pb.SamplingParams(stop_token_ids=[1] * 1_000_000)
            ),
            "sampling.stop_token_ids",
        ),
    ],
    ids=[
        "1,000,000 stop strings",
        "1,000 empty stop strings",
        "3,000,000 messages",
        "2,000,000 token ids",
        "1,000,000 choices",
        "1,000,000 stop token ids",
    ],
)
def test_huge_repeated_fields_are_refused_at_once_in_a_short_message(
    request_: pb.GenerateRequest, field: str
) -> None:
    # the collector kept out of the timing: a pass over this test process's whole heap (engines,
    # tokenizers) once took the call past the bound, and it is not a walk of the field. The
    # thread's own CPU time, not the wall's, and against what reading the request's size costs
    # (validation reads it; in C, over every field): 0.14 s of it on a quiet host, 0.5 s in the
    # whole suite's process on a loaded one
    gc.disable()
    try:
        started = time.thread_time()
        request_.ByteSize()
        sizing = time.thread_time() - started
        started = time.thread_time()
        refused = refusal(request_)
        elapsed = time.thread_time() - started
    finally:
        gc.enable()
    assert field in {v.field for v in refused.violations}
    assert len(refused.violations) <= MAX_VIOLATIONS + 1
    assert len(str(refused)) < 8 * 1024, len(str(refused))
    # counted, never walked: a walk of a million items in Python takes ten times the size's
    # reading and more, on any host
    assert elapsed < 2 * sizing + 0.25, (elapsed, sizing)


def test_many_problems_are_listed_to_a_bound_and_counted() -> None:
    request = many_messages(200)
    for message in request.chat.messages:
        message.role = "r" * 10_000
    refused = refusal(request)
    assert len(refused.violations) == MAX_VIOLATIONS + 1
    assert refused.violations[-1].field == "request"
    assert "more problems" in refused.violations[-1].description
    assert all(len(v.description) <= MAX_DESCRIPTION_CHARS for v in refused.violations)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/x.png",
        "http://[abc]/x.png",
        "http://a..b/x.png",
        f"http://{'a' * 64}.example/x.png",
        "https://images.example:99999/x.png",
    ],
)
def test_malformed_image_urls_are_invalid_arguments(url: str) -> None:
    request = pb.GenerateRequest(prompt="<image> What is it?", images=[pb.Image(url=url)])
    refused = refusal(request, takes_images=True)
    assert {v.field for v in refused.violations} == {"images[0].url"}
    assert "Error" not in str(refused)
