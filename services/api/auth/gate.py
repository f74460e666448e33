"""The gate every call of mmgate's own services passes: who the caller is, as which tenant.

    call ─▶ AuthGate.admit(context) ─▶ authenticator.grant ─▶ the tenant-header rule ─▶ Caller
                                   └─ failure: UNAUTHENTICATED / PERMISSION_DENIED, handler not run
    handler ─▶ current_caller()

The tenant-header rule: with credentials, x-mmgate-tenant may be absent or name the credential's
own tenant; any other value is refused (an admin names another tenant's entries in the request,
not by claiming to be that tenant). Without credentials (mode none) the header is the tenant, a
label any caller can set, and every caller is an admin: it is a development mode, not a boundary.
Health and reflection pass unchecked unless protected (kubelet's gRPC probes carry no credential).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import final

import grpc
from prometheus_client.core import Metric

from ...errors import InvalidRequest, MmgateError, NotPermitted, Unauthenticated, Violation
from ...observability.metric_families import auth_families
from ...wire import DEFAULT_TENANT, TENANT_HEADER, TENANT_MISMATCH
from ..interceptors.wrapping import FinalStatus, WatchingInterceptor
from ..metadata import metadata_value
from ..status import abort, from_exception
from .callers import Authenticator

log = logging.getLogger("mmgate.auth")


@final
@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: the tenant its cache entries belong to, whether it is admin, and
    the LoRA adapters it may use (None: every one, as an admin and in mode none)."""

    tenant: str
    admin: bool
    adapters: frozenset[str] | None = None
    default_adapter: str = ""  # "" : the base model

    def may_use(self, adapter: str) -> bool:
        return self.adapters is None or adapter in self.adapters


_CALLER: ContextVar[Caller] = ContextVar("mmgate_caller")


def current_caller() -> Caller:
    """The caller of the call being handled (set by the gate; LookupError outside a call)."""
    return _CALLER.get()


def checked_label(tenant: str, field: str = TENANT_HEADER) -> str:
    """A tenant's name as a caller wrote it (``field``: where, for the violation)."""
    core = tenant.replace("-", "").replace("_", "")
    if len(tenant) > 64 or not (core.isascii() and core.isalnum()):
        raise InvalidRequest([Violation(field, "1 to 64 letters, digits, - and _")])
    return tenant


@final
class AuthGate(WatchingInterceptor):
    def __init__(self, authenticator: Authenticator, open_services: frozenset[str]) -> None:
        self.authenticator = authenticator
        self.open_services = open_services
        self._watch: asyncio.Task[None] | None = None
        # calls refused, by ErrorInfo reason (mmgate_auth_refused_total)
        self.refused: Counter[str] = Counter()

    def wants(self, call: grpc.HandlerCallDetails) -> bool:
        service = call.method.lstrip("/").partition("/")[0]
        return service not in self.open_services

    def begin(self, method: str) -> object:
        return None

    def end(self, token: object, status: FinalStatus) -> None:
        return None

    async def admit(self, context: grpc.aio.ServicerContext) -> None:
        try:
            caller = self.caller(context)
        except MmgateError as exc:
            reason = exc.reason if isinstance(exc, (Unauthenticated, NotPermitted)) else None
            self.refused[reason or "INVALID_TENANT_LABEL"] += 1
            await abort(context, from_exception(exc))
        _CALLER.set(caller)

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        grant = self.authenticator.grant(context)
        header = metadata_value(context, TENANT_HEADER)
        if grant is None:
            return Caller(checked_label(header or DEFAULT_TENANT), admin=True)
        if header and header != grant.tenant:
            raise NotPermitted(
                f"{TENANT_HEADER} names a tenant other than the credential's", TENANT_MISMATCH
            )
        admin = grant.role == "admin"
        every = admin or "*" in grant.adapters
        return Caller(
            grant.tenant,
            admin=admin,
            adapters=None if every else frozenset(grant.adapters),
            default_adapter=grant.default_adapter or "",
        )

    # ── credentials that change under a running server ─────────────────────────────────────

    def collect(self) -> Iterator[Metric]:
        return auth_families(self.refused)

    def reload(self) -> None:
        """SIGHUP: read credential files anew."""
        self.authenticator.reload()

    def start(self, interval: float) -> None:
        """Poll credential files for changes (a Kubernetes Secret update sends no signal);
        nothing to poll where the credentials come from no file."""
        if self._watch is None and self.authenticator.mode == "token":
            self._watch = asyncio.ensure_future(self._poll(interval))

    async def _poll(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.authenticator.refresh()

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None


__all__ = ["AuthGate", "Caller", "checked_label", "current_caller"]
