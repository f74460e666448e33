"""The client stands alone: ``import services.client`` loads grpc, protobuf, the generated stubs
and ``services.wire``, and nothing of the server (PIL, OpenTelemetry, pydantic, the cache actor,
vLLM...).

Each import runs in a fresh interpreter of this venv. A ``.pth`` file in its site-packages imports
part of ``services`` at every interpreter start (the torchvision shim), so only what the import
adds to a bare interpreter is judged, not what that start loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the client's own dependencies; whatever they load (grpc's optional grpc_tools, typing_extensions
# of grpc.aio...) is theirs, not the client's
DEPENDENCIES = (
    "grpc",
    "grpc.aio",
    "google.protobuf.message",
    "google.rpc.status_pb2",
    "google.rpc.error_details_pb2",
    "grpc_health.v1.health_pb2_grpc",
)
FORBIDDEN = (
    "PIL",
    "opentelemetry",
    "pydantic",
    "pydantic_settings",
    "cache_actor",
    "torch",
    "vllm",
    "transformers",
    "numpy",
)


def loaded_after(imports: str) -> set[str]:
    """The modules in sys.modules of a fresh interpreter once ``imports`` ran ("" for none)."""
    code = f"import sys\n{imports}\nprint('\\n'.join(sys.modules))"
    # stderr is not judged: the .pth line may fail while the package is being restructured
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def top(module: str) -> str:
    return module.partition(".")[0]


def is_own(module: str) -> bool:
    """The modules of mmgate that the client may load."""
    return (
        module in ("services", "services.wire")
        or module.split(".")[:2] == ["services", "client"]
        or (module == "services.proto" or module.startswith("services.proto."))
    )


def test_the_client_loads_only_grpc_protobuf_and_the_wire_contract() -> None:
    start = loaded_after("")
    added = loaded_after("import services.client") - start
    theirs = loaded_after("import " + ", ".join(DEPENDENCIES)) - start

    assert "services.client" in added
    unwanted = {
        "forbidden packages": sorted({top(m) for m in added if top(m) in FORBIDDEN}),
        "mmgate beyond wire and proto": sorted(
            m for m in added if top(m) == "services" and not is_own(m)
        ),
        "not of grpc, protobuf or the stdlib": sorted(
            m
            for m in added
            if m not in theirs and top(m) not in sys.stdlib_module_names and not is_own(m)
        ),
    }
    assert {kind: modules for kind, modules in unwanted.items() if modules} == {}
