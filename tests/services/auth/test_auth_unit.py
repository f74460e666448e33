"""The parts of authentication that need no server: token tables, the sidecar's header, the
settings' rules, fair shares and the salts that keep tenants apart in vLLM's caches."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.api.auth import TokenTable, forwarded_identity, token_digest
from services.api.auth.mesh import MalformedHeader, SidecarPeers
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


def test_a_tokens_file_missing_past_the_grace_revokes_its_tokens(tmp_path: Path) -> None:
    path = tokens_file(tmp_path / "t.json", {"tok-a": "a"})
    table = TokenTable(path, {token_digest("tok-env"): Grant(tenant="e")}, missing_grace=30.0)
    path.unlink()
    table.refresh()
    # within the grace (a Secret update swapping its symlink): still valid
    assert table.grant("tok-a") == Grant(tenant="a")
    assert not table.revoked
    table.refresh(now=time.monotonic() + 31.0)
    assert table.revoked
    assert table.grant("tok-a") is None
    assert table.grant("tok-env") == Grant(tenant="e")  # not the file's to revoke
    tokens_file(path, {"tok-a": "a"})
    table.refresh()
    assert not table.revoked
    assert table.grant("tok-a") == Grant(tenant="a")


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


SIDECAR = "By=spiffe://c/ns/ml/sa/mmgate;Hash=ab"


@pytest.mark.parametrize(
    ("header", "identity"),
    [
        (f'{SIDECAR};Subject="";URI=spiffe://c/ns/a/sa/f', "spiffe://c/ns/a/sa/f"),
        # a Subject with commas, semicolons and an escaped quote inside quotes
        (f'{SIDECAR};Subject="CN=x,O=\\"y\\";z";URI=spiffe://c/ns/a/sa/f', "spiffe://c/ns/a/sa/f"),
        # a quoted URI, several DNS names
        (f'{SIDECAR};URI="spiffe://c/ns/a/sa/f";DNS=a.svc;DNS=b.svc', "spiffe://c/ns/a/sa/f"),
        # several proxies (APPEND_FORWARD): the last element is the sidecar's own
        (
            f"{SIDECAR};URI=spiffe://c/ns/a/sa/forged,{SIDECAR};URI=spiffe://c/ns/b/sa/real",
            "spiffe://c/ns/b/sa/real",
        ),
        (SIDECAR, None),
        (f"{SIDECAR};URI=", None),
    ],
)
def test_forwarded_identity(header: str, identity: str | None) -> None:
    assert forwarded_identity([header]) == identity


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        (["URI=spiffe://c/ns/ops/sa/admin"], "lacks the sidecar's By= and Hash="),
        ([f"{SIDECAR};uri=spiffe://c/ns/ops/sa/admin"], "unknown key 'uri'"),
        (["by=spiffe://c/m;hash=ab;URI=spiffe://c/ns/ops/sa/admin"], "unknown key 'by'"),
        ([f"{SIDECAR};URI=spiffe://a;URI=spiffe://b"], "URI twice"),
        ([f"{SIDECAR};URI=spiffe://a", f"{SIDECAR};URI=spiffe://b"], "more than one"),
        ([f"{SIDECAR};URI=spiffe://a,By=x;URI=spiffe://b"], "lacks the sidecar's"),
        ([f'{SIDECAR};Subject="open;URI=spiffe://a'], "unterminated"),
        ([f'{SIDECAR};URI=spiffe://a\\"b'], "quote inside"),
        ([f'{SIDECAR};URI="spiffe://a"b'], "text after its closing quote"),
        ([f"{SIDECAR};URI"], "without '='"),
        ([f"{SIDECAR};URI=spiffe://a,,{SIDECAR}"], "empty element"),
        ([""], "empty element"),
    ],
)
def test_a_header_the_sidecar_did_not_write_is_refused(headers: list[str], says: str) -> None:
    with pytest.raises(MalformedHeader, match=says):
        forwarded_identity(headers)


def test_a_sanitising_sidecar_leaves_only_its_own_element() -> None:
    chained = [f"{SIDECAR};URI=spiffe://forged,{SIDECAR};URI=spiffe://real"]
    assert forwarded_identity(chained) == "spiffe://real"
    with pytest.raises(MalformedHeader, match="sanitises"):
        forwarded_identity(chained, sanitized=True)
    assert forwarded_identity([f"{SIDECAR};URI=spiffe://real"], sanitized=True) == "spiffe://real"


@pytest.mark.parametrize(
    ("peer", "trusted"),
    [
        ("ipv4:127.0.0.6:41234", True),
        ("ipv6:[::6]:41234", True),
        ("ipv6:%5B::6%5D:41234", True),
        ("ipv6:[::ffff:127.0.0.6]:41234", True),
        ("ipv4:127.0.0.1:41234", False),
        ("ipv6:[::1]:41234", False),
        ("ipv4:10.1.2.3:41234", False),
        ("unix:/run/mmgate.sock", False),
        ("garbage", False),
    ],
)
def test_only_the_sidecars_addresses_are_trusted(peer: str, trusted: bool) -> None:
    assert (peer in SidecarPeers(AuthSettings().sidecar_peers)) is trusted


def test_sidecar_peers_take_cidrs_from_the_environment() -> None:
    settings = AuthSettings.model_validate({"sidecar_peers": ["10.0.0.0/8", "fd00::/8"]})
    peers = SidecarPeers(settings.sidecar_peers)
    assert "ipv4:10.9.8.7:5000" in peers
    assert "ipv6:[fd00::1]:5000" in peers
    assert "ipv4:127.0.0.6:5000" not in peers


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
    assert three.concurrent_requests() == 2  # the 10 less the admins' reserve of 2, shared
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
