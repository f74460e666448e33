"""The session's SmolLM2 server: the embedded default model with LoRA adapters, under token auth.

Its adapter root holds SmolLM2's test adapters a1, a2 and a3 (a1 and a2 served from the start)
and folders an admin must not get served. Three callers: alpha may use a1 and a2; beta may use
a2 only, its default; ops is an admin (every adapter, LoadAdapter and UnloadAdapter), and the
server's default credentials (``RunningServer.client()``), for the default model's own tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from services.client import Credentials
from services.config import default_model_cache
from services.models import build_test_adapter, build_tiny_model, prepare_default_model
from tests.services.auth.support import write_tokens
from tests.support import RunningServer, start_server

TOKENS = {"alpha": "alpha-adapters-51c2", "beta": "beta-adapters-90e4", "ops": "ops-adapters-3d7a"}
GRANTS: dict[str, object] = {
    TOKENS["alpha"]: {"tenant": "alpha", "adapters": ["a1", "a2"]},
    TOKENS["beta"]: {"tenant": "beta", "adapters": ["a2"], "default_adapter": "a2"},
    TOKENS["ops"]: {"tenant": "ops", "role": "admin"},
}


def build_adapter_root(root: Path, scratch: Path) -> Path:
    """SmolLM2's test adapters, and folders a load must refuse."""
    model = prepare_default_model(default_model_cache())
    for seed in (1, 2, 3):
        build_test_adapter(model, root / f"a{seed}", seed=seed)
    build_test_adapter(model, root / "rank-32", seed=4, rank=32)
    # the tiny Llama's adapter: its shapes are not SmolLM2's
    build_test_adapter(build_tiny_model(scratch / "tiny"), root / "other-model", seed=1)
    (root / "empty").mkdir()
    broken = root / "broken-config"
    shutil.copytree(root / "a1", broken)
    (broken / "adapter_config.json").write_text("{not json")
    return root


def start_smollm2(root: Path, secrets: Path, logs: Path) -> RunningServer:
    tokens = secrets / "tokens.json"
    write_tokens(tokens, GRANTS)
    return start_server(
        logs,
        None,  # the embedded SmolLM2
        Credentials(token=TOKENS["ops"]),
        MMGATE_AUTH__MODE="token",
        MMGATE_AUTH__TOKENS_FILE=str(tokens),
        MMGATE_ENGINE__ADAPTERS=json.dumps({"a1": str(root / "a1"), "a2": str(root / "a2")}),
        MMGATE_ENGINE__ADAPTER_ROOT=str(root),
        MMGATE_ENGINE__MAX_LORAS="2",
    )


__all__ = ["GRANTS", "TOKENS", "build_adapter_root", "start_smollm2"]
