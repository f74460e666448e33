"""Model folders built once: into a hidden temporary sibling, a marker written last, renamed.

A folder with the marker is complete, and an interrupted build leaves nothing at the final path.
A second build of the same recipe finds the marker and returns at once; another recipe at the
same path is an error, never an overwrite.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

__all__ = ["MARKER_NAME", "build_once"]

# Written last into a finished model directory; its presence is what "complete" means.
MARKER_NAME: Final = ".mmgate-complete"

# Bumped when a recipe changes what it writes, so an old directory is told apart from a new one.
_FORMAT: Final = 1


def build_once(target: Path, recipe: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Run ``build`` into a temporary sibling of ``target`` and rename it into place, once.

    The marker is written last and the rename is atomic, so ``target`` is either absent or
    complete. Two processes racing both build; the loser sees the winner's marker and drops its
    own copy. A ``target`` that exists without a marker was not made here (a rename never leaves
    one), so it is not deleted: that is the caller's data, and an error says so.
    """
    marker_content = {"format": _FORMAT, **recipe}
    if _is_complete(target, marker_content):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _temporary_sibling(target) as tmp:
        build(tmp)
        marker = tmp / MARKER_NAME
        marker.write_text(json.dumps(marker_content, sort_keys=True) + "\n")
        # transformers writes the weights through a private temporary file (mode 0600): give every
        # file the mode the marker got from the umask, so that other users can read the model.
        mode = marker.stat().st_mode & 0o777
        for written in tmp.rglob("*"):
            if written.is_file():
                written.chmod(mode)
        try:
            # Replaces a missing or empty directory; fails on a non-empty one.
            tmp.rename(target)
        except OSError as error:
            if _is_complete(target, marker_content):
                return target  # another process finished first
            raise FileExistsError(
                f"{target} exists but is not a model built by mmgate (no {MARKER_NAME}); "
                "remove it and try again"
            ) from error
    return target


def _is_complete(target: Path, marker_content: dict[str, Any]) -> bool:
    """Whether ``target`` is a finished build of this recipe; an error if it is another one."""
    marker = target / MARKER_NAME
    if not marker.is_file():
        return False
    found = json.loads(marker.read_text())
    if found != marker_content:
        raise FileExistsError(
            f"{target} holds another model ({found}), not the one asked for ({marker_content}); "
            "remove it or choose another path"
        )
    return True


@contextlib.contextmanager
def _temporary_sibling(target: Path) -> Iterator[Path]:
    """A hidden directory beside ``target``, removed unless it was renamed into place.

    A sibling, so that the final rename stays within one file system and is atomic.
    """
    # Not tempfile.mkdtemp: its mode 0700 would follow the directory into place, and a cache
    # prepared by one user must stay readable by the service running as another.
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
