"""The gRPC edge: the only server code that imports grpc or the generated proto modules.

server.py         MmgateServer: the composition root (builds and wires every part), health,
                  start-up and graceful shutdown; serve() runs it until SIGTERM
inference.py      the Inference servicer: proto <-> pipeline, a call's lifecycle
cache_service.py  the Cache servicer: GetStats, Prefetch, Inspect, Invalidate
validation.py     GenerateRequest -> GenerationRequest, or every violation at once
metadata.py       tenant and trace context from the call's metadata
status.py         every failure as one gRPC status with google.rpc details
interceptors/     one wrapper and one final-status rule for tracing and metrics
"""
