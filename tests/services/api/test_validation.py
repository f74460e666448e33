"""Request validation, without an engine: each bad input names its field."""

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.api.validation import validate
from services.config import Settings
from services.engine.sampling import vllm_sampling
from services.errors import InvalidRequest
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.types import Constraint, Sampling

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
    # a client built from a newer contract sends field 9 of ChatMessage ("name", say)
    known = pb.ChatMessage(role="user", content="hi").SerializeToString()
    unknown_field_9 = b"\x4a\x04name"
    message = pb.ChatMessage.FromString(known + unknown_field_9)
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


# ── the token controls ─────────────────────────────────────────────────────────────────────

VOCAB = 1000


def controls(**sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(**sampling))  # type: ignore[arg-type]


def problems_of(request: pb.GenerateRequest) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB)
    return {v.field: v.description for v in caught.value.violations}


def test_the_token_controls_reach_the_sampling() -> None:
    request = controls(
        max_tokens=32,
        min_tokens=4,
        stop_token_ids=[7, 3],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        logit_bias={9: -100.0, 2: 5.5},
        truncate_prompt_tokens=100,
    )
    checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB)
    s = checked.sampling
    assert (s.min_tokens, s.stop_token_ids) == (4, (7, 3))
    assert s.include_stop_str_in_output
    assert not s.skip_special_tokens
    assert s.logit_bias == ((2, 5.5), (9, -100.0))  # by token id: one key for one bias
    assert checked.truncate_prompt_tokens == 100
    plain = validate(controls(), SETTINGS, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB)
    assert plain.sampling.skip_special_tokens
    assert plain.truncate_prompt_tokens is None


@pytest.mark.parametrize(
    ("request_", "field", "words"),
    [
        (controls(max_tokens=4, min_tokens=5), "sampling.min_tokens", "more than max_tokens"),
        (controls(stop_token_ids=[1, VOCAB]), "sampling.stop_token_ids[1]", "vocabulary"),
        (controls(stop_token_ids=range(65)), "sampling.stop_token_ids", "the limit is 64"),
        (controls(logit_bias={VOCAB: 1.0}), f"sampling.logit_bias[{VOCAB}]", "vocabulary"),
        (controls(logit_bias={5: 100.5}), "sampling.logit_bias[5]", "between -100 and 100"),
        (controls(logit_bias={5: math.nan}), "sampling.logit_bias[5]", "between -100 and 100"),
        (controls(logit_bias=dict.fromkeys(range(301), 1.0)), "sampling.logit_bias", "300"),
        (controls(truncate_prompt_tokens=0), "sampling.truncate_prompt_tokens", "between 1"),
        (
            controls(truncate_prompt_tokens=MAX_MODEL_LEN),
            "sampling.truncate_prompt_tokens",
            f"{MAX_MODEL_LEN - 1}",
        ),
    ],
)
def test_a_bad_token_control_names_its_field(
    request_: pb.GenerateRequest, field: str, words: str
) -> None:
    problems = problems_of(request_)
    assert words in problems[field], problems


def test_truncation_is_refused_with_images() -> None:
    request = controls(truncate_prompt_tokens=10)
    request.prompt = "<image> Describe."
    request.images.add(data=b"\x89PNG\r\n\x1a\n")
    with pytest.raises(InvalidRequest) as caught:
        validate(
            request, SETTINGS, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB, takes_images=True
        )
    descriptions = {v.field: v.description for v in caught.value.violations}
    assert descriptions["sampling.truncate_prompt_tokens"] == "cannot be used with images"


FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.floats(-200, 200, width=32)
COUNTS = st.integers(-(2**31), 2**32 - 1)


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("temperature", FLOATS),
        ("top_p", FLOATS),
        ("min_p", FLOATS),
        ("presence_penalty", FLOATS),
        ("frequency_penalty", FLOATS),
        ("repetition_penalty", FLOATS),
        ("top_k", st.integers(-(2**31), 2**31 - 1)),
        ("min_tokens", st.integers(0, 2**32 - 1)),
        ("max_tokens", st.integers(0, 2**32 - 1)),
        ("stream_interval", st.integers(0, 2**32 - 1)),
        ("n", st.integers(0, 2**32 - 1)),
        ("logprobs", st.integers(0, 2**32 - 1)),
        ("prompt_logprobs", st.integers(0, 2**32 - 1)),
    ],
)
@given(data=st.data())
@settings(deadline=None)  # the first example imports vLLM
def test_what_validation_accepts_the_engine_takes(
    name: str, values: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    """No bound of vLLM's SamplingParams is wider in mmgate: a value validation lets through
    never fails in the engine, where it would be an internal error."""
    value = data.draw(values, label=name)
    request = pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(**{name: value}))
    try:
        checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB)
    except InvalidRequest:
        return
    vllm_sampling(checked.sampling)  # raises on a value vLLM refuses


def test_a_bound_only_the_engine_knows_is_still_the_callers_mistake() -> None:
    with pytest.raises(InvalidRequest) as caught:
        vllm_sampling(Sampling(max_tokens=8, temperature=3.0))
    (violation,) = caught.value.violations
    assert violation.field == "sampling.temperature"
    assert "Error" not in violation.description


def test_a_schema_is_kept_compact_in_its_own_key_order() -> None:
    spaced = '{\n  "type": "object",\n  "properties": {"b": {"type": "integer"}, "a": {}}\n}'
    request = pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(json_schema=spaced))
    checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    constraint = checked.sampling.constraint
    assert constraint is not None
    assert constraint.kind == "json_schema"
    # b before a: the output's properties come in the schema's order
    assert constraint.text == '{"type":"object","properties":{"b":{"type":"integer"},"a":{}}}'
    plain = validate(pb.GenerateRequest(prompt="Hi"), SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert plain.sampling.constraint is None


@pytest.mark.parametrize(
    ("constraint", "form"),
    [
        (Constraint("json_schema", text='{"type":"integer"}'), {"json": '{"type":"integer"}'}),
        (Constraint("regex", text="[0-9]+"), {"regex": "[0-9]+"}),
        (Constraint("grammar", text='root ::= "a"'), {"grammar": 'root ::= "a"'}),
        (Constraint("choice", choices=("x", "y")), {"choice": ["x", "y"]}),
        (Constraint("json_object"), {"json_object": True}),
    ],
)
def test_each_constraint_reaches_the_engine_as_its_own_form(
    constraint: Constraint, form: dict[str, Any]
) -> None:
    params = vllm_sampling(Sampling(max_tokens=8, constraint=constraint))
    structured = params.structured_outputs
    assert structured is not None
    for name, value in form.items():
        assert getattr(structured, name) == value


def test_the_engines_refusal_of_a_constraint_names_its_field_without_source_lines() -> None:
    from vllm.exceptions import VLLMValidationError

    from services.engine.sampling import refusal

    refused = VLLMValidationError(
        "Failed to transform regex into a grammar: [06:17:34] /project/cpp/regex_converter.cc:83:"
        " Regex parsing error at position 2: The parenthesis is not closed.\n"
    )
    error = refusal(refused, Sampling(max_tokens=8, constraint=Constraint("regex", text="(")))
    (violation,) = error.violations
    assert violation.field == "sampling.regex"
    assert violation.description == (
        "the engine refuses it: Failed to transform regex into a grammar:"
        " Regex parsing error at position 2: The parenthesis is not closed."
    )


def test_samples_and_logprobs_reach_the_engine_and_a_unary_run_asks_for_the_end_only() -> None:
    from vllm.sampling_params import RequestOutputKind

    request = pb.GenerateRequest(
        prompt="Hi",
        sampling=pb.SamplingParams(temperature=0.7, n=3, logprobs=0, prompt_logprobs=20),
    )
    s = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN).sampling
    assert (s.n, s.logprobs, s.prompt_logprobs) == (3, 0, 20)
    params = vllm_sampling(s, final_only=True)
    assert (params.n, params.logprobs, params.prompt_logprobs) == (3, 0, 20)
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    assert vllm_sampling(s).output_kind == RequestOutputKind.DELTA
    plain = validate(pb.GenerateRequest(prompt="Hi"), SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert (plain.sampling.n, plain.sampling.logprobs, plain.sampling.prompt_logprobs) == (
        1,
        None,
        None,
    )
    # greedy takes one sample: n > 1 needs a temperature
    greedy = pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(temperature=0.0, n=2))
    assert "temperature above 0" in problems_of(greedy)["sampling.n"]


def test_a_tokenized_prompt_is_checked_against_the_vocabulary_and_the_context() -> None:
    def ids(*tokens: int, **fields: Any) -> pb.GenerateRequest:
        return pb.GenerateRequest(token_ids=pb.TokenIds(ids=tokens), **fields)

    checked = validate(ids(5, 6, 7), SETTINGS, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB)
    assert (checked.token_ids, checked.prompt, checked.chat) == ((5, 6, 7), None, None)
    assert "at least one" in problems_of(ids())["token_ids.ids"]
    assert "vocabulary" in problems_of(ids(1, 2, 3, VOCAB))["token_ids.ids[3]"]
    assert f"at most {MAX_MODEL_LEN - 1}" in problems_of(ids(*[1] * MAX_MODEL_LEN))["token_ids.ids"]
    # many ids past the vocabulary: the first few named, the rest counted
    many = problems_of(ids(*[VOCAB] * 20))
    assert "token_ids.ids[7]" in many
    assert "token_ids.ids[8]" not in many
    assert "20 ids" in many["token_ids.ids"]
    with_image = ids(5, images=[pb.Image(data=b"\x89PNG")])
    with pytest.raises(InvalidRequest) as caught:
        validate(with_image, SETTINGS, max_model_len=MAX_MODEL_LEN, takes_images=True)
    assert {v.field for v in caught.value.violations} == {"images"}
