"""The server's interceptors: one wrapper (wrapping.py) and one final-status rule for all.

tracing.py   OpenTelemetry's server span, with the call's real status (RpcStatus)
metrics.py   calls by method and final code, durations, calls in flight
"""
