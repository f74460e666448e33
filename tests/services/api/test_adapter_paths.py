"""Where an admin may load adapters from, and who may use which: the rules without a server,
then the folders a hostile admin makes under the adapter root, sent to the session's SmolLM2
server (tests/services/smollm2.py): files linked out of the root, a FIFO in a file's place."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from pydantic import ValidationError

from services.api.auth import Caller
from services.config import EngineSettings, Grant
from services.engine.adapter_files import CONFIG_FILE, WEIGHTS_FILE, checked_name, folder_under
from services.errors import AdapterRefused
from tests.services.auth.support import refused
from tests.services.statuses import error_details, violated_fields
from tests.support import RunningServer


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


# more loads than asyncio's default executor has threads (at most 32): before a FIFO was refused,
# each such load left one stuck in open() and the next loads waited for a free one
FIFO_LOADS = 40


def refused_load(error: grpc.aio.AioRpcError) -> str:
    """A LoadAdapter's refusal of its path: its words, once its code and details are checked."""
    infos = [d for d in error_details(error) if isinstance(d, error_details_pb2.ErrorInfo)]
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert [info.reason for info in infos] == ["ADAPTER_REFUSED"]
    assert violated_fields(error) == {"path"}
    assert "/tmp" not in error.details()  # no path of the server's
    return error.details() or ""


async def test_a_folder_of_links_out_of_the_root_is_refused(
    smollm2_server: RunningServer, adapter_root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"  # a good adapter, but not under the root
    shutil.copytree(adapter_root / "a3", outside)
    folder = adapter_root / "links-out"
    folder.mkdir()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (folder / name).symlink_to(outside / name)
    async with smollm2_server.client() as ops:  # ops, an admin
        error = await refused(ops.load_adapter("links-out", "links-out"))
        names = [adapter.name for adapter in (await ops.model_info()).adapters]
    assert f"{CONFIG_FILE} leads out of the server's adapter root" in refused_load(error)
    assert "links-out" not in names


def release(fifo: Path) -> None:
    """Frees a server thread stuck opening ``fifo`` for reading, so that a failure here leaves
    the session's server usable for the tests after it."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:  # ENXIO: no reader waits
        if exc.errno != errno.ENXIO:
            raise


async def test_a_fifo_is_refused_at_once_and_loads_go_on(
    smollm2_server: RunningServer, adapter_root: Path
) -> None:
    folder = adapter_root / "fifo-config"
    shutil.copytree(adapter_root / "a3", folder)
    (folder / CONFIG_FILE).unlink()
    os.mkfifo(folder / CONFIG_FILE)
    try:
        # a short deadline: the refusal reads nothing, and a wait on the FIFO fails here, fast
        async with smollm2_server.client(timeout=10.0) as ops:  # ops, an admin
            for _ in range(FIFO_LOADS):
                error = await refused(ops.load_adapter("fifo", "fifo-config"))
                assert f"{CONFIG_FILE} is not a regular file" in refused_load(error)
        async with smollm2_server.client() as ops:
            loaded = await ops.load_adapter("after-fifo", "a3")
            assert await ops.unload_adapter("after-fifo") == 0
    finally:
        release(folder / CONFIG_FILE)
    assert loaded.adapter.name == "after-fifo"
