"""An adapter's files as a load reads them (copy_adapter, config_rank), without an engine: only
regular files, under the adapter root once links are followed, and never a wait on a FIFO."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TypeVar

import pytest

from services.engine.adapter_files import CONFIG_FILE, WEIGHTS_FILE, config_rank, copy_adapter
from services.errors import AdapterRefused

T = TypeVar("T")
# far above a read of two small files; far below the suite's timeout
PROMPT_SECONDS = 10.0


def write_adapter(folder: Path, rank: int = 8) -> Path:
    """An adapter's two files as copy_adapter sees them: bytes, and a config that is JSON."""
    folder.mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": rank}))
    (folder / WEIGHTS_FILE).write_bytes(b"weights of the adapter")
    return folder


def release(fifo: Path) -> None:
    """Frees a thread stuck opening ``fifo`` for reading (it then reads an empty file)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:  # ENXIO: no reader waits, nothing to free
        if exc.errno != errno.ENXIO:
            raise


def promptly(fifo: Path, read: Callable[[], T]) -> T:
    """``read()``'s result, failing the test where it waits on ``fifo`` instead of answering."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(read).result(timeout=PROMPT_SECONDS)
    except FutureTimeout:
        pytest.fail(f"the read waited on the FIFO for {PROMPT_SECONDS} s")
    finally:
        release(fifo)  # a stuck thread, freed, lets the pool end
        pool.shutdown()


def refusal(source: Path, copy: Path, root: Path | None) -> AdapterRefused:
    with pytest.raises(AdapterRefused) as refused:
        copy_adapter(source, copy, root)
    assert refused.value.field == "path"
    return refused.value


@pytest.mark.parametrize("linked", [(CONFIG_FILE,), (WEIGHTS_FILE,), (CONFIG_FILE, WEIGHTS_FILE)])
def test_a_file_linked_out_of_the_root_is_refused(tmp_path: Path, linked: tuple[str, ...]) -> None:
    root = tmp_path / "root"
    outside = write_adapter(tmp_path / "outside")
    folder = write_adapter(root / "team" / "v1")  # a real folder under the root
    for name in linked:
        (folder / name).unlink()
        (folder / name).symlink_to(outside / name)
    refused = refusal(folder, tmp_path / "copy", root)
    assert f"{linked[0]} leads out of the server's adapter root" in str(refused)
    assert str(tmp_path) not in str(refused)


def test_a_file_linked_within_the_root_is_read(tmp_path: Path) -> None:
    # a Hugging Face cache's layout: a snapshot's files are links to blobs beside it
    root = tmp_path / "root"
    blobs = write_adapter(root / "blobs")
    snapshot = root / "snapshots" / "v1"
    snapshot.mkdir(parents=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (snapshot / name).symlink_to(Path("../../blobs") / name)
    digest = copy_adapter(snapshot, tmp_path / "copy", root)
    assert digest == copy_adapter(blobs, tmp_path / "plain", root)
    assert (tmp_path / "copy" / WEIGHTS_FILE).read_bytes() == b"weights of the adapter"


def test_a_configured_adapter_may_link_anywhere(tmp_path: Path) -> None:
    # an operator's MMGATE_ENGINE__ADAPTERS: no root to stay under
    outside = write_adapter(tmp_path / "outside")
    folder = tmp_path / "configured"
    folder.mkdir()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (folder / name).symlink_to(outside / name)
    assert copy_adapter(folder, tmp_path / "copy").startswith("sha256:")
    assert config_rank(folder) == 8


@pytest.mark.parametrize("name", [CONFIG_FILE, WEIGHTS_FILE])
def test_a_fifo_is_refused_without_waiting(tmp_path: Path, name: str) -> None:
    folder = write_adapter(tmp_path / "root" / "fifo")
    (folder / name).unlink()
    os.mkfifo(folder / name)
    refused = promptly(folder / name, lambda: refusal(folder, tmp_path / "copy", tmp_path / "root"))
    assert f"{name} is not a regular file" in str(refused)


def test_config_rank_does_not_wait_on_a_fifo(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "fifo")
    (folder / CONFIG_FILE).unlink()
    os.mkfifo(folder / CONFIG_FILE)
    assert promptly(folder / CONFIG_FILE, lambda: config_rank(folder)) == 0


@pytest.mark.parametrize("name", [CONFIG_FILE, WEIGHTS_FILE])
def test_a_folder_in_a_files_place_is_refused(tmp_path: Path, name: str) -> None:
    folder = write_adapter(tmp_path / "root" / "dir")
    (folder / name).unlink()
    (folder / name).mkdir()
    refused = refusal(folder, tmp_path / "copy", tmp_path / "root")
    assert f"{name} is not a regular file" in str(refused)
    if name == CONFIG_FILE:
        assert config_rank(folder) == 0


def test_missing_and_looping_files_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    empty = root / "empty"
    empty.mkdir(parents=True)
    assert f"holds no {CONFIG_FILE}" in str(refusal(empty, tmp_path / "copy-1", root))
    looping = root / "looping"
    looping.mkdir()
    (looping / CONFIG_FILE).symlink_to(looping / CONFIG_FILE)
    refused = refusal(looping, tmp_path / "copy-2", root)
    assert f"{CONFIG_FILE} cannot be read" in str(refused)
    assert str(tmp_path) not in str(refused)
    assert config_rank(looping) == 0


def test_a_regular_adapter_is_copied_and_ranked(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "root" / "a", rank=4)
    digest = copy_adapter(folder, tmp_path / "copy", tmp_path / "root")
    assert digest.startswith("sha256:")
    assert (tmp_path / "copy" / CONFIG_FILE).read_bytes() == (folder / CONFIG_FILE).read_bytes()
    assert config_rank(folder) == 4
