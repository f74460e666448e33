"""What operators see: traces, metrics and logs (no gRPC here: the interceptors are the API's).

spans.py            CURRENT_TRACER, span() around computations, EngineTrace
lookups.py          which cache stage a lookup belongs to, its outcome's name, hook fan-out
tracing.py          the tracer provider and OTLP exporter, a span per cache lookup
metrics.py          the Prometheus registry, a lookup hook, /metrics over a snapshot function
metric_families.py  a Snapshot in, metric families out
logs.py             text or JSON lines with trace and span ids
"""
