"""The parts of authentication that need no server: token tables, the sidecar's header, the
settings' rules, fair shares and the salts that keep tenants apart in vLLM's caches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.api.auth import TokenTable, forwarded_identity, token_digest
from services.api.quotas import TenantQuotas
from services.config import AuthSettings, Grant, Settings, TenantSettings
from services.pipeline.tenancy import SHARED_TENANT, Isolation
from tests.support import ROOT


def tokens_file(path: Path, grants: dict[str, object]) -> Path:
    path.write_text(json.dumps({token_digest(t): g for t, g in grants.items()}))
    return path


def test_a_token_maps_to_its_grant_and_nothing_else_does(tmp_path: Path) -> None:
    table = TokenTable(
        tokens_file(
            tmp_path / "t.json", {"tok-a": "a", "tok-ops": {"tenant": "ops", "role": "admin"}}
        ),
        {token_digest("tok-env"): Grant(tenant="e")},
    )
    assert table.grant("tok-a") == Grant(tenant="a")
    assert table.grant("tok-ops") == Grant(tenant="ops", role="admin")
    assert table.grant("tok-env") == Grant(tenant="e")
    assert table.grant("tok-a ") is None
    assert table.grant("") is None
    assert table.tenants() == {"a", "e"}  # admins are not tenants sharing the limits


def test_a_broken_tokens_file_keeps_the_last_good_table(tmp_path: Path) -> None:
    path = tokens_file(tmp_path / "t.json", {"tok-a": "a"})
    table = TokenTable(path, {})
    assert not table.changed()
    path.write_text("{oops")
    assert table.changed()
    assert not table.reload()
    assert table.grant("tok-a") == Grant(tenant="a")
    assert not table.changed()  # the broken version is not read again and again
    tokens_file(path, {"tok-b": "b"})
    assert table.reload()
    assert table.grant("tok-a") is None
    assert table.grant("tok-b") == Grant(tenant="b")


@pytest.mark.parametrize(
    "body",
    [
        {"not-a-digest": "a"},
        {token_digest("x"): {"tenant": "has space"}},
        {token_digest("x"): {"tenant": "a", "role": "root"}},
        ["a list"],
    ],
)
def test_a_bad_tokens_file_refuses_to_start(tmp_path: Path, body: object) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match="tokens file"):
        TokenTable(path, {})


@pytest.mark.parametrize(
    ("header", "identity"),
    [
        (
            'By=spiffe://c/ns/ml/sa/mmgate;Hash=ab;Subject="";URI=spiffe://c/ns/a/sa/f',
            "spiffe://c/ns/a/sa/f",
        ),
        # a Subject with commas and semicolons inside quotes
        ('Hash=ab;Subject="CN=x,O=y;z";URI=spiffe://c/ns/a/sa/f', "spiffe://c/ns/a/sa/f"),
        # several proxies: the last element is the nearest one's
        (
            "URI=spiffe://c/ns/a/sa/forged,By=spiffe://c/m;URI=spiffe://c/ns/b/sa/real",
            "spiffe://c/ns/b/sa/real",
        ),
        ("By=spiffe://c/m;Hash=ab", None),
        ("", None),
        ("URI=", None),
    ],
)
def test_forwarded_identity(header: str, identity: str | None) -> None:
    assert forwarded_identity(header) == identity


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mode": "mtls", "identities": {"x": "a"}}, "mtls mode needs"),
        ({"mode": "token"}, "token mode needs"),
        ({"mode": "mesh"}, "mesh mode needs identities"),
        ({"tls_cert_file": "c.pem"}, "go together"),
    ],
)
def test_incomplete_auth_settings_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AuthSettings.model_validate(settings)


def test_serve_refuses_incomplete_auth_settings_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MMGATE_AUTH__MODE": "mtls", "HOME": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "mtls mode needs" in result.stderr
    assert "Traceback" not in result.stderr


def test_fair_shares_once_more_than_one_tenant_is_named() -> None:
    settings = Settings(max_concurrent_requests=10)
    assert TenantQuotas(settings, lambda: frozenset()).concurrent_requests() == 10
    assert TenantQuotas(settings, lambda: frozenset({"a"})).concurrent_requests() == 10
    three = TenantQuotas(settings, lambda: frozenset({"a", "b", "c"}))
    assert three.concurrent_requests() == 3
    assert three.cache_bytes() == settings.cache.max_bytes // 3
    # set explicitly, the setting wins (within the server's limit)
    explicit = Settings(
        max_concurrent_requests=10, tenants=TenantSettings(max_concurrent_requests=50)
    )
    assert TenantQuotas(explicit, lambda: frozenset({"a", "b"})).concurrent_requests() == 10


def test_every_tenant_has_its_own_salt_unless_sharing_is_set() -> None:
    apart = Isolation(TenantSettings())
    assert apart.cache_salt("a") != apart.cache_salt("b")
    assert apart.cache_salt("a") == apart.cache_salt("a")
    assert apart.media_tenant("a") == "a"
    digest = "sha256:" + "ab" * 32
    assert apart.image_uuids("a", (digest,)) != apart.image_uuids("b", (digest,))
    shared = Isolation(TenantSettings(share_media=True, share_prefix=True))
    assert shared.cache_salt("a") is None
    assert shared.media_tenant("a") == shared.media_tenant("b") == SHARED_TENANT
    assert shared.image_uuids("a", (digest,)) == (digest,)
