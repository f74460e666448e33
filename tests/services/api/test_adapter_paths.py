"""Where an admin may load adapters from, and who may use which: the rules without a server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.api.auth import Caller
from services.config import EngineSettings, Grant
from services.engine.adapter_files import checked_name, folder_under
from services.errors import AdapterRefused


def test_a_folder_under_the_root_is_taken(tmp_path: Path) -> None:
    (tmp_path / "team" / "v2").mkdir(parents=True)
    assert folder_under(tmp_path, "team/v2") == (tmp_path / "team" / "v2").resolve()
    assert folder_under(tmp_path, str(tmp_path / "team")) == (tmp_path / "team").resolve()


@pytest.mark.parametrize("path", ["..", "team/../..", "/etc", "escape", "escape/inner", ""])
def test_anything_that_leads_out_of_the_root_is_refused(tmp_path: Path, path: str) -> None:
    root = tmp_path / "root"
    (root / "team").mkdir(parents=True)
    (tmp_path / "outside" / "inner").mkdir(parents=True)
    (root / "escape").symlink_to(tmp_path / "outside")  # a link is followed, then judged
    with pytest.raises(AdapterRefused) as refused:
        folder_under(root, path)
    assert refused.value.field == "path"
    assert str(tmp_path) not in str(refused.value)


def test_no_root_no_loads(tmp_path: Path) -> None:
    with pytest.raises(AdapterRefused, match="loads no adapters at run time"):
        folder_under(None, str(tmp_path))


@pytest.mark.parametrize("name", ["", "a/b", "x" * 65, "tab\there", "ünï"])
def test_adapter_names_are_plain(name: str) -> None:
    with pytest.raises(AdapterRefused):
        checked_name(name)


def test_a_default_adapter_must_be_one_the_tenant_may_use() -> None:
    with pytest.raises(ValidationError, match="default_adapter"):
        Grant.model_validate({"tenant": "a", "adapters": ["x"], "default_adapter": "y"})
    assert Grant.model_validate({"tenant": "a", "adapters": ["*"], "default_adapter": "y"})


def test_who_may_use_what() -> None:
    tenant = Caller("a", admin=False, adapters=frozenset({"x"}))
    assert tenant.may_use("x")
    assert not tenant.may_use("y")
    assert Caller("ops", admin=True).may_use("y")


def test_configured_adapter_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="adapter name"):
        EngineSettings(adapters={"bad name": tmp_path})
    with pytest.raises(ValidationError, match="max_lora_rank"):
        EngineSettings(max_lora_rank=12)
    assert EngineSettings(adapter_root=tmp_path).lora
    assert not EngineSettings().lora
