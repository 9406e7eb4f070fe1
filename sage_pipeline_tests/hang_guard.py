"""One hang guard for the tests of hostile input: run a call in a thread and fail, naming what blocked,
when it has not returned in ``timeout_s`` (a FIFO opened, a device read). The timeout is a guard, never
the thing asserted: a call that returns at any speed passes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def finishes(fn: Callable[[], T], timeout_s: float = 60.0, what: str = "the call") -> T:
    """``fn()``'s value (its exception re-raised), or an assertion error when it still runs after ``timeout_s``."""
    box: dict = {}

    def go() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"{what} still blocked after {timeout_s} s (a FIFO opened? a device read?)"
    if "error" in box:
        raise box["error"]
    return box["value"]
