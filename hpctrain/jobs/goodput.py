"""Goodput by cause: each run's elapsed time as Slurm accounts it, split into the training that counted and
the time lost, by cause, from what the run's trainer and batch script journaled (the ledger's segments:
each start of the job step, whether it hung).

Per job-step start (the first, then each in-allocation restart), from its start (the run's, or the end
of the failed start before it) to the next start or the run's end:
  startup     until its checkpoint was loaded (node start-up, srun, Python, engine, checkpoint load)
  productive  its training steps (summed step times), less
  recomputed  the share of them done again: steps past the checkpoint the next start resumed from
  overhead    the rest of its training loop: checkpoint snapshots and waits, step hooks
  then from its last step to its end, by how it ended:
  hang        hung, until found and ended ([hang] timeouts)
  crash       a rank failed, until restarted (or the run ended)
  stop        stopped by a notice (preemption, time limit) or for idle GPUs: the stop's checkpoint and requeue,
              as far as Slurm counts them (a preempted run's elapsed time ends where it is preempted)
  end         trained to the end: the last checkpoint and the exit
  rerun       a whole run Slurm started on its own after the job's work was done (24.11, after a preemption)
  interactive a whole run of an interactive session (`hpctrain notebook`): a person's time at the GPUs
  other       what remains of Slurm's elapsed time (clock differences; runs that journaled nothing)
The causes add up to sacct's elapsed time. A job with spare nodes also pays for their GPUs while they wait:
``spare``, GPU time apart from the split above (hpctrain.jobs.accounting). Time in the queue after a requeue
is not the job's GPU time: it is counted apart (``queue_s``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctrain.ledger.schema import CAUSES as GPU_CAUSES  # GPU-hours are split by these, a ledger column each

CAUSES = tuple(c for c in GPU_CAUSES if c != "spare")  # a run's time is split by these
LOST = GPU_CAUSES[1:]
STOPS = ("preemption", "timeout", "cancelled", "requeued", "node_failure", "idle")


@dataclass
class Goodput:
    """One run's elapsed seconds by cause (CAUSES), and the seconds it then waited in the queue."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    queue_s: float = 0.0

    def add(self, cause: str, seconds: float) -> None:
        self.seconds[cause] += max(seconds, 0.0)

    def words(self) -> str:
        """`productive 35 s (35%), recomputed 15 s, ...` (causes with time only), and the queue after."""
        total = sum(self.seconds.values())
        parts = [
            f"{c} {s:.0f} s" + (f" ({100 * s / total:.0f}%)" if c == "productive" and total else "")
            for c, s in self.seconds.items()
            if s >= 0.5 or c == "productive"
        ]
        return ", ".join(parts) + (f"; then {self.queue_s:.0f} s in the queue" if self.queue_s else "")


def _tail(cause: str | None, last: bool, hung: bool) -> str:
    if hung:
        return "hang"
    if not last or cause in ("error", "oom"):
        return "crash"
    return "end" if cause == "completed" else "stop" if cause in STOPS else "other"


def run_goodput(
    run: Mapping[str, Any], segments: list[Mapping[str, Any]], resumed_next: int | None, elapsed_s: float, end: float
) -> Goodput:
    """Split ``run`` (an attempts row) over ``elapsed_s`` seconds ending at ``end``: its ``segments`` in order,
    and the step the job's next run resumed from (None: none did)."""
    out = Goodput()
    if run["cause"] == "rerun" or run.get("interactive"):
        out.add("rerun" if run["cause"] == "rerun" else "interactive", elapsed_s)
        return out
    begin = run["started_at"]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        seg_end = end if last else segments[i + 1]["main_at"] or end
        resumed = resumed_next if last else segments[i + 1]["resumed_from"]
        loaded = seg["loaded_at"] or seg["main_at"] or begin
        tail = _tail(run["cause"], last, bool(seg["hung"]))
        if not seg["steps"] or seg["last_step_at"] is None:  # never trained: all of it start-up, then the tail
            out.add("startup", min(loaded, seg_end) - begin)
            out.add(tail, seg_end - max(loaded, begin))
            begin = seg_end
            continue
        out.add("startup", loaded - begin)
        redo = 0.0
        if resumed is not None and resumed < seg["last_step"]:
            redo = (
                seg["step_seconds"]
                * min(seg["last_step"] - max(resumed, seg["resumed_from"] or 0), seg["steps"])
                / seg["steps"]
            )
        out.add("recomputed", redo)
        out.add("productive", seg["step_seconds"] - redo)
        out.add("overhead", seg["last_step_at"] - loaded - seg["step_seconds"])
        out.add(tail, seg_end - seg["last_step_at"])
        begin = seg_end
    counted = sum(out.seconds.values())
    if counted > elapsed_s > 0:  # clocks of several hosts: scaled down to Slurm's count
        out.seconds = {k: v * elapsed_s / counted for k, v in out.seconds.items()}
    out.seconds["other"] += max(elapsed_s - counted, 0.0)
    return out


def job_goodput(
    runs: Sequence[Mapping[str, Any]], segments: Iterable[Mapping[str, Any]], now: float
) -> dict[tuple[int, int], Goodput]:
    """Each started run of one job (attempts rows) by (task index, run number); ``segments`` are the job's."""
    by_run: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for seg in segments:
        by_run[(seg["task_index"], seg["attempt"])].append(seg)
    started = sorted((r for r in runs if r["started_at"] is not None), key=lambda r: (r["task_index"], r["attempt"]))
    out = {}
    for i, run in enumerate(started):
        key = (run["task_index"], run["attempt"])
        following = started[i + 1] if i + 1 < len(started) and started[i + 1]["task_index"] == key[0] else None
        nxt = by_run.get((key[0], following["attempt"])) if following else None
        end = run["ended_at"] or now
        elapsed = (
            run["elapsed_s"]
            if run["ended_at"] is not None and run["elapsed_s"] is not None
            else end - run["started_at"]
        )
        segs = sorted(by_run.get(key, []), key=lambda s: s["step_restart"])
        good = run_goodput(run, segs, nxt[0]["resumed_from"] if nxt else None, elapsed, end)
        if following and run["ended_at"] is not None:
            good.queue_s = max(following["started_at"] - run["ended_at"], 0.0)
        out[key] = good
    return out
