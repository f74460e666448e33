"""The embedded default model, end to end: prepared from its package, served by the real engine,
asked through the real CLI."""

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.smollm2 import TOKENS
from tests.support import ROOT, RunningServer


def mmgate(*args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        # the session's SmolLM2 server takes its admin's token
        env={**os.environ, "HF_HUB_OFFLINE": "1", "MMGATE_TOKEN": TOKENS["ops"]},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture
def default_server(smollm2_server: RunningServer) -> RunningServer:
    """The session's SmolLM2 server (tests/services/smollm2.py), asked as its admin: the base
    model, since an admin has no default adapter."""
    return smollm2_server


def test_prepare_converts_once_into_the_model_cache() -> None:
    # `mmgate models prepare` converts once into the model cache (MMGATE_MODEL_CACHE, or the
    # user's cache folder) and is instant afterwards
    prepared = Path(mmgate("models", "prepare").strip())
    assert (prepared / "config.json").is_file()


def test_cli_answers_the_capital_of_france(default_server: RunningServer) -> None:
    answer = mmgate("generate", "What is the capital of France?", "--target", default_server.target)
    assert "Paris" in answer


def test_cli_calls_a_tool_from_a_file(default_server: RunningServer, tmp_path: Path) -> None:
    # OpenAI's form of a tool, as teams keep them
    tool: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    (tmp_path / "weather.json").write_text(json.dumps(tool))
    answer = mmgate(
        "generate",
        "What is the weather in Oslo?",
        "--tool",
        str(tmp_path / "weather.json"),
        "--tool-choice",
        "get_weather",
        "--target",
        default_server.target,
    )
    (call,) = [line for line in answer.splitlines() if line.startswith("call ")]
    _, call_id, name, arguments = call.split(" ", 3)
    assert call_id
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])


async def test_streamed_chat_answer(default_server: RunningServer) -> None:
    async with default_server.client() as client:
        text = "".join(
            [
                piece
                async for piece in client.stream_text(
                    "What is the capital of France?", max_tokens=32, temperature=0.0
                )
            ]
        )
        stats = await client.stats()
    assert "Paris" in text
    assert stats.model == "SmolLM2-135M-Instruct"


async def test_model_info_of_the_embedded_model(default_server: RunningServer) -> None:
    async with default_server.client() as client:
        info = await client.model_info()
    assert info.model == "SmolLM2-135M-Instruct"
    assert info.vocab_size == 49152
    assert 2 in info.eos_token_ids  # <|im_end|>
    assert (info.takes_images, info.media_mode, info.has_chat_template) == (False, "none", True)
    assert info.structured_output_backend == "xgrammar"
    assert (info.limits.max_constraint_chars, info.limits.max_choices) == (65_536, 1024)


async def test_sampled_answers_of_the_real_model_are_instances_of_a_schema(
    default_server: RunningServer,
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},
            "country": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},
            "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
        },
        "required": ["city", "country", "population_millions"],
    }
    async with default_server.client(timeout=120.0) as client:
        answers = await asyncio.gather(
            *(
                client.complete(
                    "Name a large city as JSON.",
                    temperature=1.0,
                    max_tokens=100,
                    cache_policy="bypass",
                    json_schema=schema,
                )
                for _ in range(8)
            )
        )
    for answer in answers:
        assert answer.final.finish_reason == pb.FINISH_REASON_STOP, answer.text
        jsonschema.validate(json.loads(answer.text), schema)


def test_cli_constrains_the_answer(default_server: RunningServer, tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "pattern": "^[A-Za-z]{1,20}$"}},
        "required": ["capital"],
    }
    (tmp_path / "capital.json").write_text(json.dumps(schema))
    question = "What is the capital of France?"
    target = ("--target", default_server.target)
    answer = json.loads(
        mmgate("generate", question, "--json-schema", str(tmp_path / "capital.json"), *target)
    )
    jsonschema.validate(answer, schema)
    assert answer["capital"] == "Paris"
    assert re.fullmatch(
        r"[A-Z][a-z]+", mmgate("generate", question, "--regex", "[A-Z][a-z]+", *target).strip()
    )
    choices = ["Paris", "Lyon", "Nice"]
    picked = mmgate("generate", question, *[a for c in choices for a in ("--choice", c)], *target)
    assert picked.strip() in choices


async def test_any_json_object_from_the_real_model(default_server: RunningServer) -> None:
    async with default_server.client(timeout=120.0) as client:
        answer = await client.complete(
            "Describe Paris as a JSON object with a name and a country.",
            temperature=0.0,
            max_tokens=120,
            json_object=True,
        )
    assert answer.final.finish_reason == pb.FINISH_REASON_STOP, answer.text
    assert isinstance(json.loads(answer.text), dict)


def test_cli_prints_each_sample_and_each_tokens_logprobs(default_server: RunningServer) -> None:
    out = mmgate(
        "generate",
        "What is the capital of France?",
        *("-n", "2", "--temperature", "0.7", "--seed", "3", "--logprobs", "2"),
        *("--max-tokens", "6", "--target", default_server.target),
    )
    samples = [line for line in out.splitlines() if not line.startswith("  ")]
    assert [line[:4] for line in samples] == ["[0] ", "[1] "], out
    tokens = [line.split("\t") for line in out.splitlines() if line.startswith("  ")]
    assert len(tokens) >= 2, out
    for _token, logprob, top in tokens:
        assert float(logprob) <= 0
        assert top.strip(), out  # the most likely alternatives
