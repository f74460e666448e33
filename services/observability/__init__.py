"""What operators see: traces, metrics and logs (no gRPC here: the interceptors are the API's).

spans.py            CURRENT_TRACER, span() around computations, EngineTrace
lookups.py          a lookup's stage as a label, its outcome's name, hook fan-out
tracing.py          the tracer provider and OTLP exporter, a span per cache lookup
metrics.py          the Prometheus registry, a lookup hook, /metrics over every part's collect()
metric_families.py  one function per part's families, from that part's figures
logs.py             text or JSON lines with trace and span ids
"""
