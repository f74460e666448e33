"""Cache.Watch's messages are the journal's events converted, field for field: the kinds, the
snapshot flag and the marks where a stream stands ("synced", "gap") come from cache_actor; the
service only names the digest of a media stage's entry. The stream on a real server:
tests/services/auth/test_cache_watch.py."""

from __future__ import annotations

from cache_actor import Journal, Stage, WatchFilter
from cache_actor.store import Entry
from services.api.cache_service import _watch_event
from services.proto.mmgate.v1 import cache_pb2 as pb

DIGEST = "sha256:" + "ab" * 32


def entry(stage: Stage, label: str = "") -> Entry:
    return Entry(b"v", 10, None, 0.0, None, stage=stage, label=label)


async def test_a_watchers_events_as_messages() -> None:
    journal = Journal()
    held = [(("a", "k1"), entry(Stage.IMAGE, DIGEST))]
    watcher, first = journal.subscribe(WatchFilter(frozenset({"a"})), 0, 1, lambda: held)
    journal.publish("admit", ("a", "k2"), entry(Stage.PROMPT, "not a digest"))
    journal.publish("evict", ("a", "k3"), entry(Stage.EMBEDDING, DIGEST))  # one past its buffer
    live = await watcher.next()
    messages = [_watch_event(e) for e in [*first, watcher.synced, *live]]
    assert messages == [
        pb.WatchEvent(
            kind="held", tenant="a", stage="image", key="k1", digest=DIGEST, bytes=10, snapshot=True
        ),
        pb.WatchEvent(kind="synced", snapshot=True),
        pb.WatchEvent(sequence=1, kind="admit", tenant="a", stage="prompt", key="k2", bytes=10),
        pb.WatchEvent(sequence=1, kind="gap"),  # resume after the last one it has
    ]


def test_synced_after_the_events_missed_is_no_snapshot() -> None:
    journal = Journal()
    journal.publish("admit", ("a", "k1"), entry(Stage.ANY))
    journal.publish("invalidate", ("a", "k1"), entry(Stage.ANY))
    resumed, missed = journal.subscribe(WatchFilter(None), 1, 4, lambda: [])
    assert [_watch_event(e) for e in [*missed, resumed.synced]] == [
        pb.WatchEvent(sequence=2, kind="invalidate", tenant="a", key="k1", bytes=10),
        pb.WatchEvent(sequence=2, kind="synced"),
    ]
