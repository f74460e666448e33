"""Request validation, without an engine: each bad input names its field."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.api.validation import validate
from services.config import Settings
from services.errors import InvalidRequest
from services.proto.mmgate.v1 import inference_pb2 as pb

SETTINGS = Settings(max_prompt_chars=1000, max_chat_messages=4, max_message_bytes=64 * 1024)
MAX_MODEL_LEN = 2048


def fields_of(request: pb.GenerateRequest) -> set[str]:
    with pytest.raises(InvalidRequest) as caught:
        validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    return {v.field for v in caught.value.violations}


def chat(*turns: tuple[str, str]) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        chat=pb.Chat(messages=[pb.ChatMessage(role=r, content=c) for r, c in turns])
    )


def test_a_good_chat_request() -> None:
    request = chat(("system", "Be brief."), ("user", "Hi"))
    request.sampling.temperature = 0.0
    request.sampling.max_tokens = 16
    checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert checked.chat is not None
    assert [t.role for t in checked.chat] == ["system", "user"]
    assert checked.sampling.max_tokens == 16
    assert checked.sampling.deterministic
    assert checked.max_tokens_set
    assert len(checked.request_id) == 32  # generated


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.GenerateRequest(), "input"),
        (pb.GenerateRequest(prompt="   "), "prompt"),
        (pb.GenerateRequest(prompt="x" * 1001), "prompt"),
        (chat(), "chat.messages"),
        (chat(*[("user", "a")] * 5), "chat.messages"),
        (chat(("robot", "hi")), "chat.messages[0].role"),
        (chat(("user", "")), "chat.messages[0].content"),
        (pb.GenerateRequest(prompt="hi", request_id="bad id!"), "request_id"),
        (pb.GenerateRequest(prompt="x" * 900, request_id="r" * 129), "request_id"),
    ],
)
def test_bad_input_names_the_field(request_: pb.GenerateRequest, field: str) -> None:
    assert field in fields_of(request_)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", MAX_MODEL_LEN),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 2.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("repetition_penalty", 0.0),
        ("seed", -1),
        ("stream_interval", 0),
        ("stream_interval", MAX_MODEL_LEN + 1),
    ],
)
def test_impossible_sampling_values(name: str, value: float) -> None:
    request = pb.GenerateRequest(prompt="hi")
    setattr(request.sampling, name, value)
    assert fields_of(request) == {f"sampling.{name}"}


def test_a_stream_interval_is_the_requests_own_and_unset_leaves_the_servers() -> None:
    request = pb.GenerateRequest(prompt="hi")
    assert validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN).sampling.stream_interval is None
    request.sampling.stream_interval = MAX_MODEL_LEN
    checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert checked.sampling.stream_interval == MAX_MODEL_LEN


def test_stop_strings_are_bounded() -> None:
    request = pb.GenerateRequest(prompt="hi")
    request.sampling.stop.extend(["", "s" * 300])
    assert fields_of(request) == {"sampling.stop[0]", "sampling.stop[1]"}


def test_unknown_fields_of_chat_messages_are_refused() -> None:
    # a client built from a newer contract sends field 3 of ChatMessage ("name", say)
    known = pb.ChatMessage(role="user", content="hi").SerializeToString()
    unknown_field_3 = b"\x1a\x04name"
    message = pb.ChatMessage.FromString(known + unknown_field_3)
    request = pb.GenerateRequest(chat=pb.Chat(messages=[message]))
    assert fields_of(request) == {"chat.messages[0]"}


def test_oversized_message_is_refused() -> None:
    request = chat(*[("user", "x" * 900)] * 4)
    small = Settings(max_message_bytes=1024)
    with pytest.raises(InvalidRequest) as caught:
        validate(request, small, max_model_len=MAX_MODEL_LEN)
    assert "request" in {v.field for v in caught.value.violations}


def test_all_problems_are_reported_together() -> None:
    request = chat(("robot", ""))
    request.sampling.temperature = -1.0
    assert fields_of(request) == {
        "chat.messages[0].role",
        "chat.messages[0].content",
        "sampling.temperature",
    }


@given(
    prompt=st.text(max_size=50),
    temperature=st.floats(allow_nan=True, allow_infinity=True, width=32),
    top_p=st.floats(allow_nan=True, allow_infinity=True, width=32),
    max_tokens=st.integers(0, 2**32 - 1),
)
def test_validation_never_crashes(
    prompt: str, temperature: float, top_p: float, max_tokens: int
) -> None:
    request = pb.GenerateRequest(prompt=prompt)
    request.sampling.temperature = temperature
    request.sampling.top_p = top_p
    request.sampling.max_tokens = max_tokens
    try:
        checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    except InvalidRequest as error:
        violations = error.violations
        assert violations
    else:
        assert checked.sampling.max_tokens < MAX_MODEL_LEN
        assert 0 < (checked.sampling.top_p or 1) <= 1
        assert prompt.strip()


@pytest.mark.parametrize("request_id", ["abc\n", "abc\r\n", "abc\ninjected log line"])
def test_a_request_id_with_a_line_break_is_refused(request_id: str) -> None:
    request = pb.GenerateRequest(prompt="hi", request_id=request_id)
    assert fields_of(request) == {"request_id"}


def test_a_digest_with_a_trailing_newline_is_refused() -> None:
    digest = "sha256:" + "a" * 64
    request = pb.GenerateRequest(prompt="<image>?", images=[pb.Image(digest=digest + "\n")])
    with pytest.raises(InvalidRequest) as caught:
        validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN, takes_images=True)
    assert {v.field for v in caught.value.violations} == {"images[0].digest"}
    fine = pb.GenerateRequest(prompt="<image>?", images=[pb.Image(digest=digest)])
    assert validate(fine, SETTINGS, max_model_len=MAX_MODEL_LEN, takes_images=True).images


def test_a_negative_seed_is_refused_in_plain_words() -> None:
    request = pb.GenerateRequest(prompt="hi")
    request.sampling.seed = -1
    with pytest.raises(InvalidRequest) as caught:
        validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert [(v.field, v.description) for v in caught.value.violations] == [
        ("sampling.seed", "-1 is not 0 or more")
    ]
