"""Polling a live system until a condition holds, failing with what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait(what: str, probe: Callable[[], Any], limit_s: float, show: Callable[[], Any] = lambda: "",
         poll_s: float = 0.3) -> Any:
    """``probe()``'s first truthy result, polled every ``poll_s`` seconds for at most ``limit_s``.

    On timeout an ``AssertionError`` names ``what`` and appends ``show()`` (e.g. a log tail).
    A probe that raises fails at once (the caller decides which errors are transient).
    """
    end = time.monotonic() + limit_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {limit_s:g}s waiting for {what} {show()}")
        time.sleep(poll_s)
