"""docs/service.md's settings tables are what the settings say now (`make settings-table`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.cli import settings_table
from services.config import Settings


def rows() -> dict[str, settings_table.Row]:
    return {row.env: row for section in settings_table.sections() for row in section.rows}


def test_the_docs_tables_are_current() -> None:
    text = settings_table.DOC.read_text()
    assert settings_table.rewrite(text) == text, (
        f"docs/service.md's settings tables are stale: run `{settings_table.COMMAND}`"
    )


def test_every_setting_has_one_row_with_a_description() -> None:
    found = [row for section in settings_table.sections() for row in section.rows]
    assert len({row.env for row in found}) == len(found)
    assert [row.env for row in found if not row.description] == []
    # sections are not rows, nested models' fields are
    assert "MMGATE_ENGINE" not in rows()
    assert "MMGATE_CHAOS__DECODE__FAIL" in rows()


@pytest.mark.parametrize(
    ("env", "value", "read"),
    [
        ("MMGATE_PORT", "50052", lambda s: s.port),
        ("MMGATE_ENGINE__MAX_MODEL_LEN", "4096", lambda s: s.engine.max_model_len),
        ("MMGATE_CHAOS__DECODE__SLOW", "0.5", lambda s: s.chaos.decode.slow),
    ],
)
def test_a_row_names_the_variable_settings_read(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, read: Callable[[Settings], object]
) -> None:
    assert env in rows()
    monkeypatch.setenv(env, value)
    if env.startswith("MMGATE_CHAOS__"):
        monkeypatch.setenv("MMGATE_CHAOS__ENABLED", "true")
    assert str(read(Settings())) == value


def test_defaults_read_as_one_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # the default is the code's, not this machine's environment
    monkeypatch.setenv("MMGATE_MODEL_CACHE", "/elsewhere")
    found = rows()
    assert found["MMGATE_MODEL_CACHE"].default == "`~/.cache/mmgate/models`"
    assert found["MMGATE_MAX_MESSAGE_BYTES"].default == "`33554432` (32 MiB)"
    assert found["MMGATE_ENGINE__MODEL"].default == "unset"
    assert found["MMGATE_MEDIA__MODE"].default == "`auto` (or `embeddings`, `pixels`)"
    assert found["MMGATE_REDIS__EMBEDDING_TTL_SECONDS"].default == "`604800` (7 days)"
    assert found["MMGATE_AUTH__SIDECAR_PEERS"].default == '`["127.0.0.6/32", "::6/128"]`'


def test_a_region_holds_one_section_or_all() -> None:
    begin = "<!-- settings:begin {}(generated; do not edit) -->\n"
    end = "<!-- settings:end -->\n"
    text = f"{begin.format('health ')}old\n{end}{begin.format('')}{end}"
    written = settings_table.rewrite(text)
    health, everything = written.split("<!-- settings:end -->")[:2]
    assert "MMGATE_HEALTH__INTERVAL_SECONDS" in health
    assert "old" not in health
    assert "**" not in health
    assert "**health** (`MMGATE_HEALTH__*`)" in everything
    with pytest.raises(ValueError, match="no settings section 'nothing'"):
        settings_table.rewrite(begin.format("nothing ") + end)
