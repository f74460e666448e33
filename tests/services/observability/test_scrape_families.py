"""The scrape's families and their label names stay what dashboards and alerts were built on.

``scrape_families.json`` was taken from the server as it was before each part collected its own
figures (one snapshot of the whole service then), and families added since (the video stage's)
are added to it: a family renamed, dropped, retyped or given other labels fails here. Families
that the client library builds (``Counter``, ``Histogram``) carry no declared labels in a
collection; their names and types are checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.services.in_process import InProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")

BEFORE = Path(__file__).with_name("scrape_families.json")


async def test_the_started_server_exports_every_family_with_its_labels(
    llava_in_process: InProcess,
) -> None:
    # collected on the server's own loop, as a scrape's parts are: every part's families
    registry = llava_in_process.server.metrics.registry
    found = {}
    for family in registry.collect():
        labels = getattr(family, "_labelnames", None)
        found[family.name] = {
            "type": family.type,
            "labels": None if labels is None else sorted(labels),
        }
    assert found == json.loads(BEFORE.read_text())
