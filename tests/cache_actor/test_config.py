import pytest

from cache_actor import CacheConfig, default_weigher


def test_default_config_is_usable() -> None:
    config = CacheConfig()
    assert config.tenant_budget == config.max_bytes
    assert 0 < config.max_entry_bytes <= config.max_bytes


@pytest.mark.parametrize(
    "settings",
    [
        {"max_bytes": 0},
        {"mailbox_size": 0},
        {"default_timeout": -1.0},
        {"compute_deadline": 0.0},
        {"max_entry_fraction": 1.5},
        {"max_bytes_per_tenant": 0},
        {"ttl_seconds": 0.0},
    ],
)
def test_impossible_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="CacheConfig"):
        CacheConfig(**settings)  # type: ignore[arg-type]


def test_default_weigher() -> None:
    class Array:
        nbytes = 12

    assert default_weigher(Array()) == 12
    assert default_weigher(b"abc") == 3
    assert default_weigher(memoryview(b"abcd")) == 4
    assert default_weigher(object()) > 0
