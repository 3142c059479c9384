"""Shared by the preemption benchmarks: the high-QOS job that preempts, and waiting on a condition."""

from __future__ import annotations

import time
from typing import Any, Callable

# Takes every GPU of the dev cluster's three nodes: whatever runs in QOS low is preempted.
HIGH = {"name": "bench-urgent", "command": ["sleep", "2"], "launcher": "none",
        "resources": {"nodes": 3, "gpus_per_node": 4, "tasks_per_node": 1, "mem": "1G", "time": "5",
                      "qos": "high", "account": "teama"}}


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """``predicate()``'s first truthy value; exits the benchmark after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(interval)
    return value
