"""Waiting for a state that comes "after a while" (a job running, a journal record, a requeue), never sleeping
and then asserting."""

from __future__ import annotations

import pytest


def wait_until(predicate, timeout: float, interval: float = 0.5, what: str = "condition", seen=None):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds, saying what
    ``seen()`` (where given) says of the state then."""
    import time

    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout}s waiting for {what}" + (f"; seen then: {seen()}" if seen else ""))
        time.sleep(interval)
