"""TLS for the server: its credentials, rotated without a restart, and a peer's identities.

    files (cert, key, client CA) ─▶ CertificateFiles.config() ─▶ grpc dynamic server credentials
    each new TLS handshake ─▶ grpc asks fetch() ─▶ None (unchanged) | the files read anew

grpc calls ``fetch`` before each handshake; a rotated certificate (a cert-manager renewal, a
Secret update) is served to the next connection, and connections already open keep theirs.
A half-written rotation (the key changed, the cert not yet) is not taken: the last good
configuration stays until the files agree again.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import final

import grpc

from ...config import AuthSettings

log = logging.getLogger("mmgate.auth")


def _mtime(path: Path | None) -> float | None:
    try:
        return None if path is None else path.stat().st_mtime_ns
    except OSError:
        return None


@final
class CertificateFiles:
    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self._seen = self._stamp()
        self.rotations = 0

    def _stamp(self) -> tuple[float | None, ...]:
        return (_mtime(self.cert), _mtime(self.key), _mtime(self.client_ca))

    def config(self) -> grpc.ServerCertificateConfiguration:
        """The files as they are now; raises ValueError when they do not form a key pair."""
        cert, key = self.cert.read_bytes(), self.key.read_bytes()
        ca = None if self.client_ca is None else self.client_ca.read_bytes()
        _check_pair(self.cert, self.key)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's fetcher: a new configuration when a file has changed, None otherwise."""
        stamp = self._stamp()
        if stamp == self._seen:
            return None
        try:
            config = self.config()
        except (OSError, ValueError) as exc:
            log.warning("TLS files changed but are not usable yet (%s): keeping the last ones", exc)
            return None
        self._seen = stamp
        self.rotations += 1
        log.info("TLS certificate rotated: new connections get %s", self.cert)
        return config

    def credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.config(),
            self.fetch,
            require_client_authentication=require_client_cert,
        )


def _check_pair(cert: Path, key: Path) -> None:
    # grpc's own failure on a mismatched pair is a core log line and a refused handshake; the
    # standard library says it plainly, before grpc is handed the files
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(f"{cert} and {key} are not a certificate and its key") from exc


def peer_identities(context: grpc.aio.ServicerContext) -> tuple[str, ...]:
    """A verified client certificate's names, most specific first: URI SANs (a SPIFFE ID), DNS
    SANs, then the subject CN. Empty without a verified client certificate."""
    properties = context.auth_context() or {}
    sans = [_text(v) for v in properties.get("x509_subject_alternative_name", ())]
    uris = [s for s in sans if "://" in s]
    others = [s for s in sans if "://" not in s]
    cns = [_text(v) for v in properties.get("x509_common_name", ())]
    return tuple(dict.fromkeys([*uris, *others, *cns]))


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def certificate_files(settings: AuthSettings) -> CertificateFiles | None:
    """The server's certificate, key and (mtls) client CA; None: plaintext."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    ca = settings.client_ca_file if settings.mode == "mtls" else None
    return CertificateFiles(settings.tls_cert_file, settings.tls_key_file, ca)


__all__ = ["CertificateFiles", "certificate_files", "peer_identities"]
