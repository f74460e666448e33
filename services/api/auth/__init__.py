"""Authentication and tenants at the API edge (docs/security.md).

gate.py       the interceptor every call of mmgate's services passes; current_caller()
callers.py    one Authenticator per auth mode (none, token, mtls, mesh)
tokens.py     bearer token digests, reloaded on change and on SIGHUP
certs.py      the server's TLS credentials, rotated without a restart; a peer's names
mesh.py       the sidecar's x-forwarded-client-cert
"""

from .callers import Authenticator, announce_trust, authenticator
from .certs import CertificateFiles, certificate_files, peer_identities
from .gate import AuthGate, Caller, checked_label, current_caller
from .mesh import XFCC_HEADER, forwarded_identity
from .tokens import TokenTable, token_digest

__all__ = [
    "XFCC_HEADER",
    "AuthGate",
    "Authenticator",
    "Caller",
    "CertificateFiles",
    "TokenTable",
    "announce_trust",
    "authenticator",
    "certificate_files",
    "checked_label",
    "current_caller",
    "forwarded_identity",
    "peer_identities",
    "token_digest",
]
