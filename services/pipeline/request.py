"""One request on its way through the pipeline: what every stage needs, carried in one object.

api: validate ─▶ Pipeline.request: Request(checked, tenant, deadline, trace headers, cache salt,
     adapter)
     ─▶ prompt stage, media stage (a MediaCall: the tenant's namespace of images, the deadline),
        shared responses: each appends its LookupReport
     ─▶ request.engine_request(prompt, sampling, images): the one way an engine run is made
     ─▶ Finished (the reports with it)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

from cache_actor import Lookup, Stage

from ..media_types import EngineVideos
from ..types import (
    AdapterRef,
    EngineImages,
    EngineRequest,
    GenerationRequest,
    LookupReport,
    Sampling,
)
from .cache_front import outcome_of


def seconds_left(deadline: float) -> float:
    """What is left of a ``time.monotonic()`` deadline, never negative."""
    return max(0.0, deadline - time.monotonic())


def loop_deadline(deadline: float) -> float:
    """A ``time.monotonic()`` deadline on the running loop's clock (for asyncio.timeout_at)."""
    return asyncio.get_running_loop().time() + seconds_left(deadline)


@final
@dataclass(frozen=True, slots=True)
class MediaCall:
    """A request's (or a prefetch's) image work: the namespace its images are cached in, which is
    not always its tenant (tenancy.py), and the deadline that bounds every wait of it."""

    tenant: str
    # time.monotonic()
    deadline: float

    def left(self) -> float:
        return seconds_left(self.deadline)


@final
@dataclass(slots=True)
class Request:
    """A validated request, whose tenant it is, until when it may run, and what it looked up."""

    checked: GenerationRequest
    tenant: str
    # time.monotonic(): every wait inside the request is bounded by it
    deadline: float
    trace_headers: Mapping[str, str] = field(default_factory=dict)
    lookups: list[LookupReport] = field(default_factory=list)
    # the tenant's salt of the engine's prefix cache (tenancy.py); None: shared by all
    cache_salt: str | None = None
    # the LoRA adapter the caller may use and named (or defaults to); None: the base model
    adapter: AdapterRef | None = None
    # lower is more urgent (the tenant's range was checked by the API)
    priority: int = 0

    def left(self) -> float:
        return seconds_left(self.deadline)

    def engine_request(
        self,
        prompt_token_ids: tuple[int, ...],
        sampling: Sampling,
        images: EngineImages | None,
        videos: EngineVideos | None = None,
        *,
        final_only: bool = False,
    ) -> EngineRequest:
        """A run of the engine for this request (or, shared, for everyone who joins it), under an
        id of mmgate's own: no caller can name, or abort, another's engine request. The caller's
        id is its label, for spans and logs. ``final_only``: the run's outputs at its end only."""
        return EngineRequest(
            request_id=f"mmgate-{uuid.uuid4().hex}",
            label=self.checked.request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=sampling,
            images=images,
            videos=videos,
            trace_headers=self.trace_headers or None,
            cache_salt=self.cache_salt,
            final_only=final_only,
            adapter=self.adapter,
            priority=self.priority,
        )

    def report(
        self,
        stage: Stage,
        key: str,
        lookup: Lookup[Any] | None,
        started: float,
        outcome: str | None = None,
    ) -> None:
        """One cache stage's outcome (``lookup`` None: the request's policy bypassed it)."""
        found, reason = outcome_of(lookup) if lookup is not None else ("bypass", "policy")
        self.lookups.append(
            LookupReport(
                stage=stage,
                key=key,
                outcome=outcome or found,
                tier=(lookup.tier or "") if lookup is not None else "",
                wait_ms=(time.perf_counter() - started) * 1000,
                reason=reason,
            )
        )


__all__ = [
    "MediaCall",
    "Request",
    "loop_deadline",
    "seconds_left",
]
