from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatsRequest(_message.Message):
    __slots__ = ("all_tenants",)
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    all_tenants: bool
    def __init__(self, all_tenants: _Optional[bool] = ...) -> None: ...

class TenantStats(_message.Message):
    __slots__ = ("tenant", "hits", "tier_hits", "misses", "coalesced", "load_failures", "entries", "bytes", "budget_bytes", "active_requests", "max_concurrent_requests", "hit_ratio")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TIER_HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    LOAD_FAILURES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    hits: int
    tier_hits: int
    misses: int
    coalesced: int
    load_failures: int
    entries: int
    bytes: int
    budget_bytes: int
    active_requests: int
    max_concurrent_requests: int
    hit_ratio: float
    def __init__(self, tenant: _Optional[str] = ..., hits: _Optional[int] = ..., tier_hits: _Optional[int] = ..., misses: _Optional[int] = ..., coalesced: _Optional[int] = ..., load_failures: _Optional[int] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., active_requests: _Optional[int] = ..., max_concurrent_requests: _Optional[int] = ..., hit_ratio: _Optional[float] = ...) -> None: ...

class ActorStats(_message.Message):
    __slots__ = ("hits", "tier_hits", "misses", "coalesced", "load_successes", "load_failures", "load_seconds", "evictions", "evicted_bytes", "expirations", "oversize_rejections", "recursion_rejections", "compute_timeouts", "caller_timeouts", "cancelled_waiters", "overloaded", "tier_errors", "tier_write_errors", "stalled_flights", "entries", "bytes", "flights", "waiters", "mailbox_depth", "loop_lag_seconds", "oldest_flight_seconds", "tier_breaker_open", "alive", "hit_ratio")
    HITS_FIELD_NUMBER: _ClassVar[int]
    TIER_HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    LOAD_SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    LOAD_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPIRATIONS_FIELD_NUMBER: _ClassVar[int]
    OVERSIZE_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    RECURSION_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    CALLER_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_WAITERS_FIELD_NUMBER: _ClassVar[int]
    OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    TIER_ERRORS_FIELD_NUMBER: _ClassVar[int]
    TIER_WRITE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    STALLED_FLIGHTS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FLIGHTS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    MAILBOX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    LOOP_LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FLIGHT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIER_BREAKER_OPEN_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    hits: int
    tier_hits: int
    misses: int
    coalesced: int
    load_successes: int
    load_failures: int
    load_seconds: float
    evictions: int
    evicted_bytes: int
    expirations: int
    oversize_rejections: int
    recursion_rejections: int
    compute_timeouts: int
    caller_timeouts: int
    cancelled_waiters: int
    overloaded: int
    tier_errors: int
    tier_write_errors: int
    stalled_flights: int
    entries: int
    bytes: int
    flights: int
    waiters: int
    mailbox_depth: int
    loop_lag_seconds: float
    oldest_flight_seconds: float
    tier_breaker_open: bool
    alive: bool
    hit_ratio: float
    def __init__(self, hits: _Optional[int] = ..., tier_hits: _Optional[int] = ..., misses: _Optional[int] = ..., coalesced: _Optional[int] = ..., load_successes: _Optional[int] = ..., load_failures: _Optional[int] = ..., load_seconds: _Optional[float] = ..., evictions: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., expirations: _Optional[int] = ..., oversize_rejections: _Optional[int] = ..., recursion_rejections: _Optional[int] = ..., compute_timeouts: _Optional[int] = ..., caller_timeouts: _Optional[int] = ..., cancelled_waiters: _Optional[int] = ..., overloaded: _Optional[int] = ..., tier_errors: _Optional[int] = ..., tier_write_errors: _Optional[int] = ..., stalled_flights: _Optional[int] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ..., flights: _Optional[int] = ..., waiters: _Optional[int] = ..., mailbox_depth: _Optional[int] = ..., loop_lag_seconds: _Optional[float] = ..., oldest_flight_seconds: _Optional[float] = ..., tier_breaker_open: _Optional[bool] = ..., alive: _Optional[bool] = ..., hit_ratio: _Optional[float] = ...) -> None: ...

class EngineCacheStats(_message.Message):
    __slots__ = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_ratio", "requests", "requests_with_cached_prefix", "running", "waiting", "kv_cache_usage", "aborted")
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_WITH_CACHED_PREFIX_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_ratio: float
    requests: int
    requests_with_cached_prefix: int
    running: int
    waiting: int
    kv_cache_usage: float
    aborted: int
    def __init__(self, prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., prefix_cache_hit_ratio: _Optional[float] = ..., requests: _Optional[int] = ..., requests_with_cached_prefix: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., aborted: _Optional[int] = ...) -> None: ...

class MediaStats(_message.Message):
    __slots__ = ("decodes", "decode_seconds", "encodes", "encode_seconds", "rejected", "not_held", "encode_batches")
    DECODES_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENCODES_FIELD_NUMBER: _ClassVar[int]
    ENCODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    NOT_HELD_FIELD_NUMBER: _ClassVar[int]
    ENCODE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    decodes: int
    decode_seconds: float
    encodes: int
    encode_seconds: float
    rejected: int
    not_held: int
    encode_batches: int
    def __init__(self, decodes: _Optional[int] = ..., decode_seconds: _Optional[float] = ..., encodes: _Optional[int] = ..., encode_seconds: _Optional[float] = ..., rejected: _Optional[int] = ..., not_held: _Optional[int] = ..., encode_batches: _Optional[int] = ...) -> None: ...

class VideoStats(_message.Message):
    __slots__ = ("decodes", "decode_seconds", "frames", "rejected", "not_held", "stopped", "encodes", "encode_seconds")
    DECODES_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    NOT_HELD_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    ENCODES_FIELD_NUMBER: _ClassVar[int]
    ENCODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    decodes: int
    decode_seconds: float
    frames: int
    rejected: int
    not_held: int
    stopped: int
    encodes: int
    encode_seconds: float
    def __init__(self, decodes: _Optional[int] = ..., decode_seconds: _Optional[float] = ..., frames: _Optional[int] = ..., rejected: _Optional[int] = ..., not_held: _Optional[int] = ..., stopped: _Optional[int] = ..., encodes: _Optional[int] = ..., encode_seconds: _Optional[float] = ...) -> None: ...

class EngineHealth(_message.Message):
    __slots__ = ("state", "in_flight", "seconds_since_step", "stalls")
    STATE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_STEP_FIELD_NUMBER: _ClassVar[int]
    STALLS_FIELD_NUMBER: _ClassVar[int]
    state: str
    in_flight: int
    seconds_since_step: float
    stalls: int
    def __init__(self, state: _Optional[str] = ..., in_flight: _Optional[int] = ..., seconds_since_step: _Optional[float] = ..., stalls: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("actor", "engine", "model", "media_mode", "media", "engine_health", "tenant", "tenants", "video")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEDIA_MODE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    ENGINE_HEALTH_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    actor: ActorStats
    engine: EngineCacheStats
    model: str
    media_mode: str
    media: MediaStats
    engine_health: EngineHealth
    tenant: str
    tenants: _containers.RepeatedCompositeFieldContainer[TenantStats]
    video: VideoStats
    def __init__(self, actor: _Optional[_Union[ActorStats, _Mapping]] = ..., engine: _Optional[_Union[EngineCacheStats, _Mapping]] = ..., model: _Optional[str] = ..., media_mode: _Optional[str] = ..., media: _Optional[_Union[MediaStats, _Mapping]] = ..., engine_health: _Optional[_Union[EngineHealth, _Mapping]] = ..., tenant: _Optional[str] = ..., tenants: _Optional[_Iterable[_Union[TenantStats, _Mapping]]] = ..., video: _Optional[_Union[VideoStats, _Mapping]] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("key", "digest", "tenant")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    key: str
    digest: str
    tenant: str
    def __init__(self, key: _Optional[str] = ..., digest: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class StageEntry(_message.Message):
    __slots__ = ("stage", "key", "state", "bytes", "age_seconds", "hits", "tier", "waiters")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    key: str
    state: str
    bytes: int
    age_seconds: float
    hits: int
    tier: str
    waiters: int
    def __init__(self, stage: _Optional[str] = ..., key: _Optional[str] = ..., state: _Optional[str] = ..., bytes: _Optional[int] = ..., age_seconds: _Optional[float] = ..., hits: _Optional[int] = ..., tier: _Optional[str] = ..., waiters: _Optional[int] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("key", "state", "bytes", "age_seconds", "hits", "tier", "waiters", "stages")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    key: str
    state: str
    bytes: int
    age_seconds: float
    hits: int
    tier: str
    waiters: int
    stages: _containers.RepeatedCompositeFieldContainer[StageEntry]
    def __init__(self, key: _Optional[str] = ..., state: _Optional[str] = ..., bytes: _Optional[int] = ..., age_seconds: _Optional[float] = ..., hits: _Optional[int] = ..., tier: _Optional[str] = ..., waiters: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[StageEntry, _Mapping]]] = ...) -> None: ...

class InvalidateRequest(_message.Message):
    __slots__ = ("key", "digest", "tenant")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    key: str
    digest: str
    tenant: str
    def __init__(self, key: _Optional[str] = ..., digest: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class InvalidateResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("data", "mime_type")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mime_type: str
    def __init__(self, data: _Optional[bytes] = ..., mime_type: _Optional[str] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ("digest", "outcome", "tier", "form")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    FORM_FIELD_NUMBER: _ClassVar[int]
    digest: str
    outcome: str
    tier: str
    form: str
    def __init__(self, digest: _Optional[str] = ..., outcome: _Optional[str] = ..., tier: _Optional[str] = ..., form: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("since", "all_tenants", "stage", "tenant")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    since: int
    all_tenants: bool
    stage: str
    tenant: str
    def __init__(self, since: _Optional[int] = ..., all_tenants: _Optional[bool] = ..., stage: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("sequence", "kind", "tenant", "stage", "key", "digest", "bytes", "tier", "snapshot")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kind: str
    tenant: str
    stage: str
    key: str
    digest: str
    bytes: int
    tier: str
    snapshot: bool
    def __init__(self, sequence: _Optional[int] = ..., kind: _Optional[str] = ..., tenant: _Optional[str] = ..., stage: _Optional[str] = ..., key: _Optional[str] = ..., digest: _Optional[str] = ..., bytes: _Optional[int] = ..., tier: _Optional[str] = ..., snapshot: _Optional[bool] = ...) -> None: ...
