"""docs/clients.md as it stands: each of its examples run against live servers in auth modes token
(over TLS) and mtls, with the settings it reads from the environment, printing the completion
and the tenant the credentials map to.

The examples are the fenced blocks after ``<!-- example: NAME -->``; the Node.js one imports the
packages ``make node-client`` installs into build/node; grpcurl's use grpcurl from PATH, or the
one ``make grpcurl`` puts in build/bin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
from google.protobuf import json_format, message_factory

from services.proto.mmgate.v1 import cache_pb2, inference_pb2
from tests.services.auth.support import TOKENS, Pki
from tests.support import RunningServer
from tests.tls_support import Issued

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "clients.md"
NODE_MODULES = ROOT / "build" / "node" / "node_modules"
# `make grpcurl` puts grpcurl here where none is on PATH
LOCAL_BIN = ROOT / "build" / "bin"
# a first request on a busy machine waits for the engine's first step
EXAMPLE_TIMEOUT = 180

_EXAMPLE = re.compile(
    r"<!-- example: (?P<name>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<code>.*?)\n```\n", re.S
)
EXAMPLES: dict[str, tuple[str, str]] = {
    found["name"]: (found["lang"], found["code"] + "\n")
    for found in _EXAMPLE.finditer(DOC.read_text("utf-8"))
}
# each auth mode runs the examples that take either credential, and those written for it
COMMON = ("python-async", "python-sync", "node")
BY_MODE = {mode: (*COMMON, f"cli-{mode}", f"grpcurl-{mode}") for mode in ("token", "mtls")}
CASES = [(mode, name) for mode, names in BY_MODE.items() for name in names]
# the constrained-output examples: each prints a record of the schema they hold
CONSTRAINED = ("node-json-schema", "grpcurl-json-schema")
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["city", "population"],
}


def test_the_doc_has_each_example_once() -> None:
    names = _EXAMPLE.findall(DOC.read_text("utf-8"))
    assert len(names) == len(EXAMPLES), "an example name used twice"
    assert set(EXAMPLES) == {name for _, name in CASES} | set(CONSTRAINED) | {
        "node-samples",
        "node-tools",
    }
    languages = {name: lang for name, (lang, _) in EXAMPLES.items()}
    assert languages == {
        "python-async": "python",
        "python-sync": "python",
        "node": "javascript",
        "cli-token": "bash",
        "cli-mtls": "bash",
        "grpcurl-token": "bash",
        "grpcurl-mtls": "bash",
        "node-json-schema": "javascript",
        "grpcurl-json-schema": "bash",
        "node-samples": "javascript",
        "node-tools": "javascript",
    }


def test_the_doc_pins_the_node_packages_make_installs() -> None:
    makefile = (ROOT / "Makefile").read_text("utf-8")
    found = re.search(r"^NODE_PACKAGES := (.+)$", makefile, re.M)
    assert found is not None, "no NODE_PACKAGES in the Makefile"
    assert f"npm install {found.group(1)}\n" in DOC.read_text("utf-8")


@pytest.mark.parametrize("name", ["grpcurl-token", "grpcurl-mtls"])
def test_the_grpcurl_examples_name_real_methods_and_messages(name: str) -> None:
    """What runs only where grpcurl is installed, checked everywhere: each method it calls
    exists, and each request body (-d) is the method's input message in protobuf's JSON."""
    code = EXAMPLES[name][1]
    calls = re.findall(r"(?:-d '(?P<body>[^']*)'[\s\\]+)?\"\$MMGATE_TARGET\" (?P<method>\S+)", code)
    assert [method for _, method in calls] == [
        "mmgate.v1.Inference/Complete",
        "mmgate.v1.Cache/GetStats",
    ], code
    services = {
        service.full_name: service
        for module in (inference_pb2, cache_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    for body, method in calls:
        service, _, rpc = method.partition("/")
        input_type = services[service].methods_by_name[rpc].input_type
        message = message_factory.GetMessageClass(input_type)()
        json_format.Parse(body or "{}", message)
        if isinstance(message, inference_pb2.GenerateRequest):
            assert message.sampling.max_tokens == 8, body


def _environment(server: RunningServer, mode: str, pki: Pki, alpha_cert: Issued) -> dict[str, str]:
    """This process's environment without MMGATE_* settings, then the examples' own; the venv's
    bin first on PATH (``mmgate``, its python)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MMGATE_")}
    env["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), env.get("PATH", ""), str(LOCAL_BIN)]
    )
    env["MMGATE_TARGET"] = server.target
    env["MMGATE_TLS_CA"] = str(pki.ca.issued.cert)
    if mode == "token":
        env["MMGATE_TOKEN"] = TOKENS["alpha"]
    else:
        env["MMGATE_TLS_CERT"] = str(alpha_cert.cert)
        env["MMGATE_TLS_KEY"] = str(alpha_cert.key)
    return env


def _command(name: str, lang: str, code: str, directory: Path) -> list[str]:
    if lang == "python":
        script = directory / f"{name}.py"
        script.write_text(code)
        return [sys.executable, str(script)]
    if lang == "javascript":
        node = shutil.which("node")
        if node is None or not (NODE_MODULES / "@grpc" / "grpc-js").is_dir():
            pytest.fail(
                "node or its gRPC packages not found: `make node-client` installs them",
                pytrace=False,
            )
        # an ES module resolves its imports from node_modules beside it (NODE_PATH is for require)
        (directory / "node_modules").symlink_to(NODE_MODULES, target_is_directory=True)
        script = directory / "client.mjs"
        script.write_text(code)
        return [node, str(script)]
    assert lang == "bash"
    if name.startswith("grpcurl") and grpcurl() is None:
        pytest.fail("grpcurl not found on PATH or in build/bin: `make grpcurl`", pytrace=False)
    return ["bash", "-euo", "pipefail", "-c", code]


def grpcurl() -> str | None:
    return shutil.which("grpcurl") or shutil.which("grpcurl", path=str(LOCAL_BIN))


def _printed_completion_and_tenant(output: str) -> tuple[str, str]:
    """The Python and Node.js examples print the completion, then ``tenant: NAME``."""
    text, _, tenant = output.rstrip("\n").rpartition("\n")
    assert tenant.startswith("tenant: "), output
    return text, tenant.removeprefix("tenant: ")


def _grpcurl_completion_and_tenant(output: str) -> tuple[str, str]:
    """grpcurl prints each response as JSON: the CompleteResponse, then the GetStatsResponse."""
    decoder = json.JSONDecoder()
    responses, at = [], 0
    while at < len(output.rstrip()):
        while output[at].isspace():
            at += 1
        response, at = decoder.raw_decode(output, at)
        responses.append(response)
    complete, stats = responses
    # protobuf's JSON names (camel case), as grpcurl prints them; the .proto's names also taken
    usage = complete["final"]["usage"]
    assert usage.get("completionTokens", usage.get("completion_tokens", 0)) > 0, output
    return complete["text"], stats["tenant"]


def _cli_completion_and_tenant(output: str) -> tuple[str, str]:
    """``mmgate generate`` prints the completion; ``mmgate stats`` a table headed by the model,
    the media mode and the caller's tenant."""
    text, header, table = output.partition("  model ")
    assert header, output
    assert table.split("\n", 1)[0].strip() not in ("", "-"), output
    assert "cache levels" in table, output
    found = re.search(r"^  tenant +(\S+)$", table, re.M)
    assert found is not None, output
    return text, found.group(1)


# how each kind of example prints the completion and the tenant
OUTPUTS: dict[str, Callable[[str], tuple[str, str]]] = {
    "cli": _cli_completion_and_tenant,
    "grpcurl": _grpcurl_completion_and_tenant,
}


def _run_example(
    name: str, server: RunningServer, mode: str, pki: Pki, cert: Issued, directory: Path
) -> tuple[subprocess.CompletedProcess[str], str]:
    """The example run as a user would, against ``server``; it exited 0. Its run and a text
    showing it for a failure."""
    lang, code = EXAMPLES[name]
    done = subprocess.run(
        _command(name, lang, code, directory),
        cwd=ROOT,
        env=_environment(server, mode, pki, cert),
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
        check=False,
    )
    shown = f"{name} in mode {mode}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, shown
    return done, shown


@pytest.mark.parametrize(("mode", "name"), CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_example_runs_as_documented(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    pki: Pki,
    client_certs: dict[str, Issued],
    mode: str,
    name: str,
) -> None:
    server: RunningServer = request.getfixturevalue(f"{mode}_server")
    done, shown = _run_example(name, server, mode, pki, client_certs["alpha"], tmp_path)
    parse = OUTPUTS.get(name.partition("-")[0], _printed_completion_and_tenant)
    text, tenant = parse(done.stdout)
    assert tenant == "alpha", shown
    assert text.strip(), f"no completion text: {shown}"


@pytest.mark.parametrize("name", CONSTRAINED)
def test_a_constrained_example_prints_an_instance_of_its_schema(
    tmp_path: Path,
    pki: Pki,
    client_certs: dict[str, Issued],
    token_server: RunningServer,
    name: str,
) -> None:
    # the example's own schema is the one checked here
    assert "^[A-Za-z ]{1,20}$" in EXAMPLES[name][1]
    assert "100000000" in EXAMPLES[name][1]
    done, _ = _run_example(name, token_server, "token", pki, client_certs["alpha"], tmp_path)
    printed = json.loads(done.stdout)
    record = json.loads(printed["text"]) if name.startswith("grpcurl") else printed
    jsonschema.validate(record, CITY)


def test_the_samples_example_prints_each_sample_with_its_logprobs(
    tmp_path: Path, pki: Pki, client_certs: dict[str, Issued], token_server: RunningServer
) -> None:
    done, shown = _run_example(
        "node-samples", token_server, "token", pki, client_certs["alpha"], tmp_path
    )
    samples = [json.loads(line) for line in done.stdout.splitlines()]
    assert [sample["index"] for sample in samples] == [0, 1, 2], shown
    for sample in samples:
        assert sample["finish"] in ("FINISH_REASON_STOP", "FINISH_REASON_LENGTH"), shown
        assert sample["tokens"], shown
        for token in sample["tokens"]:
            assert token["logprob"] <= 0, shown
            top = [logprob for _, logprob in token["top"]]
            assert 1 <= len(top) <= 2, shown
            assert top == sorted(top, reverse=True), shown


def test_the_tools_example_makes_a_call_sends_its_result_and_prints_the_answer(
    tmp_path: Path, pki: Pki, client_certs: dict[str, Issued], token_server: RunningServer
) -> None:
    done, shown = _run_example(
        "node-tools", token_server, "token", pki, client_certs["alpha"], tmp_path
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    *calls, answer = lines
    assert [line["call"]["name"] for line in calls] == ["get_weather"], shown
    arguments = json.loads(calls[0]["call"]["arguments"])
    jsonschema.validate(arguments, {"type": "object", "required": ["city"]})
    assert calls[0]["call"]["id"], shown
    # the answer after the result is text, not another call
    assert answer["finish"] in ("FINISH_REASON_STOP", "FINISH_REASON_LENGTH"), shown
