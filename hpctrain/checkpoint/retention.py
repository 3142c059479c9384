"""Which committed checkpoints to keep: the newest few, the best few by a metric, and every pinned one."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from hpctrain.checkpoint.commit import to_trash
from hpctrain.checkpoint.naming import list_dirs
from hpctrain.checkpoint.pins import pin_lock, pinned
from hpctrain.checkpoint.reader import quick_check
from hpctrain.errors import CheckpointError
from hpctrain.ledger.journal import Journal

log = logging.getLogger("hpctrain.checkpoint")
PIN_WAIT_S = 10.0  # at most this long a save waits for a registration holding the pins


@dataclass(frozen=True)
class Retention:
    """Keep the ``keep_last`` newest valid checkpoints and the ``keep_best`` best by ``metric`` (``mode``)."""

    keep_last: int = 3
    keep_best: int = 0
    metric: str | None = None
    mode: str = "min"

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError("keep_last must be at least 1: the newest checkpoint is always kept")
        if self.keep_best and not self.metric:
            raise ValueError("keep_best needs a metric name")
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {self.mode!r}")

    def doomed(self, scores: dict[int, float | None]) -> list[int]:
        """Steps to delete among valid checkpoints ``{step: metric value or None}``."""
        steps = sorted(scores)
        keep = set(steps[-self.keep_last :])
        ranked = {s: v for s, v in scores.items() if isinstance(v, (int, float)) and not math.isnan(v)}
        sign = 1 if self.mode == "min" else -1
        keep.update(sorted(ranked, key=lambda s: (sign * ranked[s], -s))[: self.keep_best])
        return [s for s in steps if s not in keep]


def apply_retention(directory: Path, policy: Retention, tag: str, journal: Journal | None) -> list[Path]:
    """Take the checkpoints ``policy`` lets go out of sight (to trash: see ``commit.stale_dirs``),
    after the newest commit; returns them.

    Only valid checkpoints count (so the newest valid one always survives); invalid ones are left for
    a person to look at, and pinned ones (`hpctrain model register`) for good.
    """
    valid = {}
    for d in list_dirs(directory):
        try:
            valid[d.step] = (d.path, quick_check(d.path))
        except CheckpointError:
            continue
    scores = {s: m.data.get("metrics", {}).get(policy.metric) for s, (_, m) in valid.items()}
    doomed = [(step, valid[step][0]) for step in policy.doomed(scores)]
    if not doomed:
        return []
    deleted = []
    try:
        # the pins as they are now, and no new one until the doomed are gone (see pins.py)
        with pin_lock(directory, PIN_WAIT_S):
            kept = pinned(directory)
            for step, path in doomed:
                if path.name in kept:
                    continue
                to_trash(path, step, tag)
                log.info("retention: deleted %s", path)
                if journal:
                    journal.write("checkpoint", step=step, path=str(path), state="deleted", note="retention")
                deleted.append(path)
    except TimeoutError as exc:  # a registration holds the pins: keep everything this time, the next save retries
        log.warning("retention: %s; kept every checkpoint this time", exc)
    return deleted
