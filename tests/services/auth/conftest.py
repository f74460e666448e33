"""Servers with real authentication over real TLS on loopback, and the credentials of their
callers: certificates made here (cryptography), tokens written to a tokens file.

- ``token_server``: the tiny LLaVA in pixels mode (mmgate caches decoded images, vLLM's own
  processor and prefix caches are live), auth mode token over TLS, a real redis-server as the
  second tier; tenants "alpha" and "beta", and "ops", an admin.
- ``mtls_server``: the tiny text model's tokenizer over the synthetic engine, auth mode mtls
  (client certificates of one CA).
- ``mesh_server``: the tiny LLaVA in pixels mode, auth mode mesh (plaintext behind a sidecar:
  HAProxy connecting from 127.0.0.6, as Istio's does), as a single organisation runs it: media
  and prefixes shared by its tenants.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.client import Credentials
from services.models import build_tiny_llava
from tests.haproxy import TcpProxy
from tests.redis_support import RedisProcess, redis_server
from tests.services.auth.support import (
    MESH_IDENTITIES,
    TOKEN_GRANTS,
    Mesh,
    MiB,
    Pki,
    with_cert,
    write_tokens,
)
from tests.support import RunningServer, start_server
from tests.tls_support import CertificateAuthority, Issued


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(directory)
    return Pki(ca, ca.issue("server", "mmgate", server=True), directory)


@pytest.fixture(scope="session")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secrets") / "tokens.json"
    write_tokens(path, TOKEN_GRANTS)
    return path


@pytest.fixture(scope="session")
def tenants_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = redis_server(tmp_path_factory.mktemp("tenants-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def token_server(
    tmp_path_factory: pytest.TempPathFactory,
    pki: Pki,
    tokens_file: Path,
    tenants_redis: RedisProcess,
) -> Iterator[RunningServer]:
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    running = start_server(
        tmp_path_factory.mktemp("token-server"),
        str(model),
        Credentials(tls_ca=pki.ca.issued.cert),
        MMGATE_MEDIA__MODE="pixels",
        MMGATE_AUTH__MODE="token",
        MMGATE_AUTH__TOKENS_FILE=str(tokens_file),
        MMGATE_AUTH__RELOAD_SECONDS="0.2",
        MMGATE_AUTH__TOKENS_MISSING_GRACE_SECONDS="1.0",
        MMGATE_AUTH__TLS_CERT_FILE=str(pki.server.cert),
        MMGATE_AUTH__TLS_KEY_FILE=str(pki.server.key),
        # two tenants configured: each gets half of these by default (a cache budget of 1 MiB
        # a tenant: about a hundred images fill it, so the watch test sees evictions)
        MMGATE_MAX_CONCURRENT_REQUESTS="8",
        # Cache.Watch's bounds where a test reaches them: 4 watchers a tenant (the default) of
        # 8, and a watcher whose client reads nothing ended after 2 s (test_cache_watch.py)
        MMGATE_CACHE__MAX_WATCHERS="8",
        MMGATE_CACHE__WATCH_IDLE_SECONDS="2",
        MMGATE_CACHE__MAX_BYTES=str(2 * MiB),
        MMGATE_REDIS__URL=tenants_redis.url,
        MMGATE_ENGINE__MAX_MODEL_LEN="2048",
        MMGATE_MAX_MESSAGE_BYTES=str(16 * MiB),
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="session")
def client_certs(pki: Pki) -> dict[str, Issued]:
    """Client certificates of the server's CA, and one of another CA with the same names."""
    stranger = CertificateAuthority(pki.directory / "other-ca", "another CA")
    return {
        "alpha": pki.ca.issue("alpha", "alpha-client", uris=("spiffe://test/ns/apps/sa/alpha",)),
        "beta": pki.ca.issue("beta", "beta-client", dns=("beta.apps.svc",)),
        "ops": pki.ca.issue("ops", "ops-console"),
        "unmapped": pki.ca.issue("unmapped", "nobody-knows-me"),
        "foreign": stranger.issue(
            "foreign", "alpha-client", uris=("spiffe://test/ns/apps/sa/alpha",)
        ),
    }


@pytest.fixture(scope="session")
def mtls_server(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model: str,
    pki: Pki,
    client_certs: dict[str, Issued],
) -> Iterator[RunningServer]:
    # its own copy of the server certificate: the rotation test replaces these files
    directory = tmp_path_factory.mktemp("mtls-server")
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    identities = {
        # each kind of name a certificate can carry: URI SAN, DNS SAN, CN
        "spiffe://test/ns/apps/sa/alpha": "alpha",
        "beta.apps.svc": "beta",
        "ops-console": {"tenant": "ops", "role": "admin"},
    }
    running = start_server(
        directory,
        tiny_model,
        with_cert(pki, client_certs["alpha"]),
        MMGATE_AUTH__MODE="mtls",
        MMGATE_AUTH__TLS_CERT_FILE=str(cert),
        MMGATE_AUTH__TLS_KEY_FILE=str(key),
        MMGATE_AUTH__CLIENT_CA_FILE=str(pki.ca.issued.cert),
        MMGATE_AUTH__IDENTITIES=json.dumps(identities),
        # who may call is the front's alone: the synthetic engine answers
        MMGATE_ENGINE__SYNTHETIC="{}",
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    running = start_server(
        tmp_path_factory.mktemp("mesh-server"),
        str(model),
        MMGATE_AUTH__MODE="mesh",
        MMGATE_AUTH__IDENTITIES=json.dumps(MESH_IDENTITIES),
        MMGATE_MEDIA__MODE="pixels",
        MMGATE_TENANTS__SHARE_MEDIA="true",
        MMGATE_TENANTS__SHARE_PREFIX="true",
        MMGATE_ENGINE__MAX_MODEL_LEN="2048",
    )
    sidecar = TcpProxy(
        tmp_path_factory.mktemp("sidecar"), [running.port], source="127.0.0.6"
    ).start()
    try:
        yield Mesh(dataclasses.replace(running, port=sidecar.port), running.target)
    finally:
        sidecar.stop()
        assert running.stop() == 0, running.log()


@pytest.fixture(scope="session")
def mesh_server(mesh: Mesh) -> RunningServer:
    return mesh.server
