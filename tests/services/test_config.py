"""One source for each default: the cache actor's settings as the service configures them, the
model cache as the settings read it; a pair of engine settings vLLM refuses is refused at start."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from cache_actor import CacheConfig, Journal
from services.config import (
    CacheSettings,
    EngineSettings,
    RedisSettings,
    Settings,
    TenantSettings,
    default_model_cache,
)

# the service's name for each of the actor's settings it exposes
SERVICE_NAMES = {
    "max_bytes": ("cache", "max_bytes"),
    "ttl_seconds": ("cache", "ttl_seconds"),
    "mailbox_size": ("cache", "mailbox_size"),
    "compute_deadline": ("cache", "compute_deadline"),
    "stall_threshold": ("cache", "stall_threshold"),
    "max_entry_fraction": ("cache", "max_entry_fraction"),
    "tier_timeout": ("redis", "timeout_seconds"),
    "tier_write_queue": ("redis", "write_queue"),
    "tier_breaker_failures": ("redis", "breaker_failures"),
    "tier_breaker_seconds": ("redis", "breaker_seconds"),
    "max_tenants": ("tenants", "max_labels"),
}


def test_the_settings_defaults_are_the_actors() -> None:
    actor = {f.name: f.default for f in dataclasses.fields(CacheConfig)}
    sections = {"cache": CacheSettings(), "redis": RedisSettings(), "tenants": TenantSettings()}
    for name, (section, setting) in SERVICE_NAMES.items():
        assert getattr(sections[section], setting) == actor[name], name
    # the journal the service hands the actor: the settings' defaults are its own
    journal = Journal()
    assert (CacheSettings().watch_history, CacheSettings().max_watchers) == (
        journal.history_size,
        journal.max_watchers,
    )


@pytest.mark.parametrize(
    ("written", "meant"),
    [("/srv/models", "/srv/models"), ("~/models", "~/models"), ("", "~/.cache/mmgate/models")],
)
def test_the_model_cache_is_read_by_the_settings_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, written: str, meant: str
) -> None:
    # MMGATE_MODEL_CACHE as a shell means it, the same for whoever asks: the server, the
    # engine's dtype verdicts, `mmgate models prepare`
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MMGATE_MODEL_CACHE", written)
    expected = Path(meant).expanduser()
    assert Settings().model_cache == expected
    assert default_model_cache() == expected


def test_the_actor_gets_every_setting_by_its_value() -> None:
    cache = CacheSettings(max_bytes=1 << 20, ttl_seconds=5.0, max_entry_fraction=0.5)
    redis = RedisSettings(timeout_seconds=0.7, breaker_seconds=3.0)
    config = cache.actor_config(redis, tenant_bytes=1 << 10, max_tenants=7)
    assert (config.max_bytes, config.ttl_seconds, config.max_entry_fraction) == (1 << 20, 5.0, 0.5)
    assert (config.tier_timeout, config.tier_breaker_seconds) == (0.7, 3.0)
    assert (config.max_bytes_per_tenant, config.max_tenants) == (1 << 10, 7)
    # unchanged settings: the actor's own defaults
    assert config.mailbox_size == CacheConfig().mailbox_size


def test_compact_json_needs_a_named_backend_and_serve_says_so_in_a_line() -> None:
    assert not EngineSettings(structured_output_backend="auto", compact_json=False).compact_json
    with pytest.raises(ValidationError):
        EngineSettings(structured_output_backend="auto")
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve"],
        env={**os.environ, "MMGATE_ENGINE__STRUCTURED_OUTPUT_BACKEND": "auto"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "mmgate serve: engine: Value error, compact_json needs structured_output_backend xgrammar"
        " or guidance (not auto); set compact_json false to use it"
    ]
