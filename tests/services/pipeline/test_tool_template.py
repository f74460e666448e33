"""mmgate's tool-aware ChatML template, rendered by the prompt stage with the tiny model's
tokenizer (whose own ChatML template ignores tools): tools in the system turn, an assistant's
calls and their results in Hermes' tags, and the same text where another server renders it."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from services.api.validation import validate
from services.config import Settings
from services.pipeline.prompts import ToolTemplate, _render_with, prompt_payload
from services.pipeline.tool_template import (
    HERMES_TOOLS_TEMPLATE,
    standalone_template,
    template_variables,
)
from services.proto.mmgate.v1 import inference_pb2 as pb

WEATHER = pb.Tool(
    name="get_weather",
    description="The weather in a city",
    parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}),
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str) -> object:
    return AutoTokenizer.from_pretrained(tiny_model)


def rendered(tokenizer: object, request: pb.GenerateRequest, setting: str = "auto") -> str:
    checked = validate(request, Settings(), max_model_len=2048)
    return _render_with(tokenizer, checked, ToolTemplate(setting)).text  # type: ignore[arg-type]


ROUND_TRIP = pb.Chat(
    messages=[
        pb.ChatMessage(role="user", content="Weather in Oslo and Rome?"),
        pb.ChatMessage(
            role="assistant",
            tool_calls=[
                pb.ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}'),
                pb.ToolCall(id="c2", name="get_weather", arguments='{"city": "Rome"}'),
            ],
        ),
        pb.ChatMessage(role="tool", content="3 C", tool_call_id="c1"),
        pb.ChatMessage(role="tool", content="21 C", tool_call_id="c2"),
    ],
    tools=[WEATHER],
)


def test_tools_calls_and_results_are_rendered_in_hermes_tags(tokenizer: object) -> None:
    text = rendered(tokenizer, pb.GenerateRequest(chat=ROUND_TRIP))
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    # the schema goes in as the caller wrote it
    assert '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        '\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
        "\n</tool_call><|im_end|>\n"
    ) in text
    # consecutive results: one user turn
    assert (
        "<|im_start|>user\n<tool_response>\n3 C\n</tool_response>\n<tool_response>\n21 C"
        "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_chat_without_tools_keeps_the_models_template(tokenizer: object) -> None:
    plain = pb.GenerateRequest(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="Hi")]))
    assert "<tools>" not in rendered(tokenizer, plain)
    assert rendered(tokenizer, plain) == rendered(tokenizer, plain, "hermes")


def test_the_model_setting_leaves_tools_to_the_models_template(tokenizer: object) -> None:
    text = rendered(tokenizer, pb.GenerateRequest(chat=ROUND_TRIP), "model")
    assert "<tools>" not in text  # the tiny model's ChatML template ignores them


def test_the_standalone_template_renders_the_same_text(tokenizer: object) -> None:
    messages = [
        {"role": "system", "content": 'Be "brief".'},
        {"role": "user", "content": "Weather?"},
    ]
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    ours = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages,
        tools=tools,
        chat_template=HERMES_TOOLS_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
        **template_variables(),
    )
    theirs = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages,
        tools=tools,
        chat_template=standalone_template(),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert ours == theirs
    assert ours.startswith('<|im_start|>system\nBe "brief".\n\n# Tools')


def test_the_prompt_key_holds_the_tools_and_the_calls(tokenizer: object) -> None:
    with_tools = validate(pb.GenerateRequest(chat=ROUND_TRIP), Settings(), max_model_len=2048)
    other = pb.GenerateRequest(chat=ROUND_TRIP)
    other.chat.tools[0].description = "Another description"
    changed = validate(other, Settings(), max_model_len=2048)
    assert prompt_payload(with_tools) != prompt_payload(changed)
    call = pb.GenerateRequest(chat=ROUND_TRIP)
    call.chat.messages[1].tool_calls[0].arguments = '{"city": "Bergen"}'
    assert prompt_payload(with_tools) != prompt_payload(
        validate(call, Settings(), max_model_len=2048)
    )
