"""What the benchmark scripts' command lines share: argparse types that refuse a bad count with a
usage error naming the flag (exit 2), not a traceback later."""

from __future__ import annotations

import argparse


def count(text: str) -> int:
    """A whole number >= 1 (seeds, workers, episodes)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {n}")
    return n
