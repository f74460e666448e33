"""Generate mmgate's Python gRPC code from proto/ into services/proto/ (``make proto``).

The generated code is committed, so installing mmgate needs no code generator; a test
regenerates it and fails when the committed copy is stale. protoc's ``-I<virtual>=<real>`` maps
proto/ to services/proto/, so generated modules import each other as ``services.proto...``
while the wire names stay ``mmgate.v1.*``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE = "services/proto"


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_dir: Path) -> None:
    """Write the generated modules for every .proto file under ``out_dir``/services/proto."""
    import grpc_tools
    from grpc_tools import protoc  # a dev dependency: only needed here

    include = Path(grpc_tools.__file__).parent / "_proto"
    sources = [f"{PACKAGE}/{p.relative_to(PROTO_DIR)}" for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"-I{PACKAGE}={PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    for package in {out_dir / PACKAGE / p.parent.relative_to(PROTO_DIR) for p in proto_files()}:
        for directory in [package, *package.parents]:
            if directory == out_dir / "services":
                break
            (directory / "__init__.py").touch()


if __name__ == "__main__":
    generate(ROOT)
    sys.stdout.write(f"generated {PACKAGE} from {PROTO_DIR.relative_to(ROOT)}\n")
