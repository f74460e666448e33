"""Bearer tokens: SHA-256 digests of tokens mapped to grants, from a file and the environment.

    authorization: Bearer <token> ─▶ sha256 ─▶ compared with every known digest (constant time)
    tokens file changed (polled) or SIGHUP ─▶ reload ─▶ a broken file keeps the last good table
    tokens file missing past the grace period ─▶ its tokens refused until it returns

Only digests are configured and kept: a leaked configuration does not leak a usable token.
A missing file is not a broken one: a Secret update swaps a symlink, so the file may be absent
for a moment and the tokens are kept; absent past the grace period, it was deleted (a revocation
by removal), and keeping its tokens would leave them valid for ever.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import final

from pydantic import TypeAdapter, ValidationError

from ...config import AuthSettings, Grant

log = logging.getLogger("mmgate.auth")

_GRANTS = TypeAdapter(dict[str, Grant])
# one source: the setting's own default
_MISSING_GRACE: float = AuthSettings.model_fields["tokens_missing_grace_seconds"].default


def token_digest(token: str) -> str:
    """What a tokens file holds for ``token``: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def _checked(grants: Mapping[str, Grant], source: str) -> dict[str, Grant]:
    table = {}
    for digest, grant in grants.items():
        key = digest.removeprefix("sha256:").lower()
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            # a prefix only: a token pasted here by mistake must not reach the log whole
            raise ValueError(f"{source}: {digest[:8]}... is not a SHA-256 hex digest")
        table[key] = grant
    return table


@final
class TokenTable:
    def __init__(
        self,
        file: Path | None,
        fixed: Mapping[str, Grant],
        *,
        missing_grace: float = _MISSING_GRACE,
    ) -> None:
        self.file = file
        self.missing_grace = missing_grace
        self._missing_since: float | None = None  # time.monotonic() when the file went missing
        self.revoked = False  # the file's tokens are refused: it is missing past the grace
        self._fixed = _checked(fixed, "MMGATE_AUTH__TOKENS")
        self._stamp: tuple[int, int] | None = None
        self._table: dict[str, Grant] = {}
        self._tenants: frozenset[str] = frozenset()
        self.reloads = 0
        self.reload_failures = 0
        # a bad file at start: refuse to start
        self._use({**self._read(file), **self._fixed} if file is not None else dict(self._fixed))
        self._stamp = self._file_stamp()

    def _use(self, table: dict[str, Grant]) -> None:
        self._table = table
        # read on every request (the fair share): derived once per load, not per call
        self._tenants = frozenset(g.tenant for g in table.values() if g.role == "tenant")

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.file.stat() if self.file is not None else None
        except OSError:
            return None
        # a Secret update swaps a symlink: inode and mtime both say "new"
        return None if stat is None else (stat.st_ino, stat.st_mtime_ns)

    @staticmethod
    def _read(file: Path) -> dict[str, Grant]:
        try:
            raw = json.loads(file.read_text())
            grants = _GRANTS.validate_python(raw)
        except (OSError, json.JSONDecodeError, ValidationError) as exc:
            raise ValueError(f"tokens file {file}: {_reason(exc)}") from None
        return _checked(grants, f"tokens file {file}")

    def changed(self) -> bool:
        return self.file is not None and self._file_stamp() != self._stamp

    def reload(self) -> bool:
        """Read the file again; on failure keep the table as it was. True if it was replaced."""
        if self.file is None:
            return False
        stamp = self._file_stamp()
        if stamp is None and not self.file.exists():
            self._stamp = None
            if self._missing_since is None:
                self._missing_since = time.monotonic()
                log.warning(
                    "tokens file %s is missing; its tokens stay valid for %g s unless it returns",
                    self.file,
                    self.missing_grace,
                )
            return False
        try:
            table = self._read(self.file)
        except ValueError as exc:
            self.reload_failures += 1
            self._stamp = stamp  # logged once per change, not once per poll
            log.error("%s; keeping the %d tokens loaded before", exc, len(self._table))
            return False
        self._use({**table, **self._fixed})
        self._stamp = stamp
        self._missing_since = None
        self.revoked = False
        self.reloads += 1
        log.info("tokens reloaded from %s: %d tokens", self.file, len(self._table))
        return True

    def refresh(self, now: float | None = None) -> None:
        """The poll: reload a changed file; refuse a missing file's tokens past the grace."""
        if self.changed():
            self.reload()
        if self._missing_since is None or self.revoked:
            return
        now = time.monotonic() if now is None else now
        if now - self._missing_since >= self.missing_grace:
            self._use(dict(self._fixed))
            self.revoked = True
            log.error(
                "tokens file %s has been missing for %g s: every token it held is refused "
                "until it returns",
                self.file,
                self.missing_grace,
            )

    def grant(self, token: str) -> Grant | None:
        """The grant of a presented token, or None. Every digest is compared, in constant time,
        so the time taken says nothing about how close a guess came."""
        presented = token_digest(token).encode()
        found: Grant | None = None
        for digest, grant in self._table.items():
            if hmac.compare_digest(presented, digest.encode()):
                found = grant
        return found

    def tenants(self) -> frozenset[str]:
        return self._tenants


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg}, line {exc.lineno})"
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


__all__ = ["TokenTable", "token_digest"]
