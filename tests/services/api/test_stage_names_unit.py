"""The stage names are ``cache_actor.Stage``'s: every list of them is derived from it, and the
proto's comments, which cannot be, are checked against it."""

from __future__ import annotations

import re
from pathlib import Path

from cache_actor import Stage
from services.api.cache_service import WATCH_STAGES
from services.cli.cache_watch import STAGES as CLI_STAGES
from services.observability.metric_families import MEDIA_STAGES

PROTO = Path(__file__).resolve().parents[3] / "proto" / "mmgate" / "v1"
NAMED = frozenset(stage.value for stage in Stage if stage is not Stage.ANY)
MEDIA = frozenset(stage.value for stage in Stage if stage.is_media)


def documented(proto: str, message: str, field: str) -> set[str]:
    """The quoted names in a field's comments: the lines just above it and its own line's."""
    text = (PROTO / proto).read_text()
    body = re.search(rf"message {message} {{\n(.*?)\n}}", text, re.S)
    assert body is not None, message
    lines = body.group(1).splitlines()
    [at] = [i for i, line in enumerate(lines) if re.match(rf"\s*string {field} = \d+;", line)]
    above = at
    while above > 0 and lines[above - 1].strip().startswith("//"):
        above -= 1
    return set(re.findall(r'"(\w*)"', "\n".join(lines[above : at + 1])))


def test_the_lists_of_stages_are_the_enums() -> None:
    assert {stage.value for stage in Stage} == NAMED | {""}
    assert frozenset(Stage) == WATCH_STAGES
    assert set(CLI_STAGES) == NAMED
    assert (
        MEDIA_STAGES == MEDIA == {Stage.IMAGE, Stage.EMBEDDING, Stage.VIDEO, Stage.VIDEO_EMBEDDING}
    )


def test_the_proto_documents_the_enums_stages() -> None:
    assert documented("cache.proto", "WatchRequest", "stage") == NAMED | {""}
    assert documented("cache.proto", "StageEntry", "stage") == MEDIA
    assert documented("inference.proto", "CacheLookup", "stage") <= NAMED
