"""argparse types shared by the ``mmgate`` commands: a bad value is refused with a short reason."""

from __future__ import annotations

import argparse


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
