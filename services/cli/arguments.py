"""argparse types shared by the ``mmgate`` commands: a bad value is refused with a short reason."""

from __future__ import annotations

import argparse
import os

from ..client import Credentials


def count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or min(int(width), int(height)) < 8:
        raise argparse.ArgumentTypeError("WIDTHxHEIGHT, each side 8 or more")
    return int(width), int(height)


__all__ = ["count", "positive", "share", "size"]


def add_credentials(parser: argparse.ArgumentParser) -> None:
    """--token, --tls-ca, --tls-cert, --tls-key: how the command proves who it is."""
    group = parser.add_argument_group("credentials (docs/security.md)")
    group.add_argument(
        "--token", help="bearer token (auth mode token); default: $MMGATE_TOKEN, kept off argv"
    )
    group.add_argument("--tls-ca", metavar="PEM", help="the CA of the server's certificate: TLS")
    group.add_argument("--tls-cert", metavar="PEM", help="client certificate (auth mode mtls)")
    group.add_argument("--tls-key", metavar="PEM", help="the client certificate's key")


def credentials(args: argparse.Namespace) -> Credentials:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("mmgate: --tls-cert and --tls-key go together")
    return Credentials(
        token=args.token or os.environ.get("MMGATE_TOKEN") or None,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
