#!/usr/bin/env python3
"""mmgate's container health check: ask the gRPC health service whether a service is SERVING.

    mmgate-healthcheck [SERVICE] [--target HOST:PORT] [--timeout SECONDS]
                       [--tls-ca PEM [--server-name NAME] [--tls-cert PEM --tls-key PEM]]

SERVICE is "liveness" unless named: it is SERVING from the moment the port opens until the
engine has failed or hung, which is what a restart should follow. "readiness" (or "", the
overall status) says whether mmgate can serve now: for a `depends_on: service_healthy` or a
load balancer. The exit status is 0 for SERVING and 1 for anything else: NOT_SERVING, a service
the server does not know, no answer within the timeout, a refused connection or handshake.

The target is 127.0.0.1 (or MMGATE_HOST where that is one address, not 0.0.0.0 or ::) on
MMGATE_PORT (default 50051), as the entry point gives mmgate serve. Plaintext unless --tls-ca is
given; with TLS, --server-name is the name the server's certificate carries (it seldom covers
127.0.0.1), and --tls-cert/--tls-key a client certificate for auth mode mtls. A health service
behind credentials (auth.protect_health) is not what this check is for.

It needs grpcio and grpcio-health-checking, which mmgate installs, and nothing of mmgate's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_PORT = "50051"
WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def default_target() -> str:
    host = os.environ.get("MMGATE_HOST", "").strip()
    if host in WILDCARDS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port = os.environ.get("MMGATE_PORT", "").strip() or DEFAULT_PORT
    return f"{host}:{port}"


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mmgate-healthcheck", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("service", nargs="?", default="liveness", help="default: liveness")
    parser.add_argument("--target", default=default_target(), help="HOST:PORT")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    parser.add_argument("--tls-ca", metavar="PEM", help="CA of the server's certificate: TLS")
    parser.add_argument("--server-name", help="the name to check the server's certificate for")
    parser.add_argument("--tls-cert", metavar="PEM", help="client certificate (auth mode mtls)")
    parser.add_argument("--tls-key", metavar="PEM", help="the client certificate's key")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_ca is None and (args.tls_cert is not None or args.server_name is not None):
        parser.error("--tls-cert, --tls-key and --server-name need --tls-ca")
    return args


def channel(args: argparse.Namespace) -> grpc.Channel:
    if args.tls_ca is None:
        return grpc.insecure_channel(args.target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(args.tls_ca).read_bytes(),
        private_key=Path(args.tls_key).read_bytes() if args.tls_key else None,
        certificate_chain=Path(args.tls_cert).read_bytes() if args.tls_cert else None,
    )
    options = []
    if args.server_name:
        options.append(("grpc.ssl_target_name_override", args.server_name))
    return grpc.secure_channel(args.target, credentials, options=options)


def check(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether ``args.service`` is SERVING at ``args.target``, and what was seen."""
    with channel(args) as opened:
        stub = health_pb2_grpc.HealthStub(opened)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as error:  # a unary call's error is also its grpc.Call
            details = error.details()
            return False, f"{error.code().name}: {details}" if details else error.code().name
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        serving, seen = check(args)
    except OSError as error:  # a certificate file that cannot be read
        serving, seen = False, str(error)
    shown = args.service or '""'
    sys.stdout.write(f"{args.target} {shown}: {seen}\n")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
