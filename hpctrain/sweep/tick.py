"""One sweep tick, the cron entry: refresh, stop, resubmit, suggest, submit, and exit.

Ticks serialise on a lock file next to the ledger. A tick is idempotent: each trial is written to
the ledger before it is submitted and linked to its job in the transaction that records the job,
so a second tick right after the first finds nothing missing and submits nothing.
"""

from __future__ import annotations

import contextlib
import getpass
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.config.site import SiteConfig
from hpctrain.errors import HpctrainError, SlurmError
from hpctrain.files import exclusive_lock
from hpctrain.jobs.reconcile import reconcile
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import CANCEL_ENDED, SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.sweep import store
from hpctrain.sweep.methods import suggest
from hpctrain.sweep.stopping import trials_to_stop

if TYPE_CHECKING:
    from hpctrain.submit.arrays import ArrayChunk

LOCK_WAIT_S = 600.0


@dataclass
class TickResult:
    sweep: str
    submitted: list[int] = field(default_factory=list)
    resubmitted: list[int] = field(default_factory=list)
    stopped: dict[int, str] = field(default_factory=dict)
    state: str = "ACTIVE"
    error: str | None = None
    capped: str | None = None  # why fewer than max_parallel trials run at once


@contextlib.contextmanager
def tick_lock(ledger_path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """An exclusive lock file beside the ledger: concurrent ticks (overlapping cron runs, on any login node or in a
    scrontab job) take turns."""
    path = ledger_path.with_name(ledger_path.name + ".sweep-lock")
    try:
        with exclusive_lock(path, wait_s):
            yield
    except TimeoutError:
        raise HpctrainError(f"{path}: another sweep tick has held the lock for over {wait_s:g}s") from None


def tick_all(
    ledger: Ledger,
    client: SlurmClient,
    site: SiteConfig,
    sweep_ids: list[str] | None = None,
    on_warning: Callable[[str], None] = lambda _: None,
) -> list[TickResult]:
    """Tick the given sweeps (default: every active one) after one controller check and one sacct call."""
    client.ping()  # the controller down: fail here, before anything is written
    refreshed = reconcile(ledger, client, site.name)
    if refreshed.warning:
        on_warning(refreshed.warning)
    if sweep_ids is None:
        sweep_ids = ledger.sweeps.active()
    with ledger.reading():
        for sweep_id in sweep_ids:
            store.load(ledger, sweep_id)  # an unknown name: the whole tick fails, in one line, before any is ticked
    results = []
    for sweep_id in sweep_ids:
        try:
            results.append(tick(ledger, client, site, sweep_id))
        except HpctrainError as exc:
            client.ping()  # the controller gone meanwhile is no fault of this sweep: fail the tick
            results.append(_failed(ledger, sweep_id, exc))
    return results


def _failed(ledger: Ledger, sweep_id: str, exc: HpctrainError) -> TickResult:
    """A sweep whose tick failed on its own account (its job refused, say) is marked FAILED and left out of
    later ticks, so that the other sweeps tick on."""
    ledger.sweeps.set_state(sweep_id, "FAILED")
    ledger.event("sweep_failed", str(exc), sweep=sweep_id)
    return TickResult(sweep_id, state="FAILED", error=str(exc))


def tick(ledger: Ledger, client: SlurmClient, site: SiteConfig, sweep_id: str) -> TickResult:
    """One sweep's decisions on states already refreshed from Slurm (see `tick_all`)."""
    with ledger.reading():  # the ledger's side in one read; Slurm is called only after it
        sweep = store.load(ledger, sweep_id)
        if sweep.state != "ACTIVE":
            return TickResult(sweep.id, state=sweep.state)
        rows = store.refresh(ledger, sweep)
    result = TickResult(sweep.id, state=sweep.state)
    spec = sweep.spec
    if spec.early_stopping is not None:
        result.stopped = _early_stop(ledger, client, sweep, rows)
    result.resubmitted = _retry_failed(ledger, sweep, rows)
    in_slurm = sum(r["state"] in ("pending", "running") for r in rows)
    active = in_slurm + sum(r["state"] == "new" for r in rows)
    parallel = spec.max_parallel
    if in_slurm < parallel:  # the limits are read only when trials are due
        parallel, result.capped = _parallel(ledger, client, site, sweep)
    if parallel > active:
        curves = store.intermediate(ledger, sweep, [r["number"] for r in rows if r["state"] == "pruned"], spec.metric)
        ledger.sweeps.add_trials(sweep.id, len(rows), suggest(spec, store.records(rows, curves), parallel - active))
    # Retried trials wait their turn too: no more go to Slurm than may run at once.
    result.submitted = _submit_new(ledger, client, site, sweep, parallel - in_slurm)
    if not result.submitted and _all_done(ledger, sweep):
        ledger.sweeps.set_state(sweep.id, "DONE")
        result.state = "DONE"
    return result


def _parallel(ledger: Ledger, client: SlurmClient, site: SiteConfig, sweep: store.Sweep) -> tuple[int, str | None]:
    """How many trials may run at once: max_parallel, or fewer where the account's or QOS's limits would
    leave the rest pending (and why)."""
    from hpctrain.submit.placement import choose_placement  # only when trials are due: a tick's usual import
    from hpctrain.submit.quota import parallel_cap, user_limits

    wanted = sweep.spec.max_parallel
    user, r = getpass.getuser(), sweep.job.resources
    placement = choose_placement(sweep.job, site, client, user, f"<sweep {sweep.id}>", ledger)
    try:
        limits = user_limits(site, client, user, ledger, accounts=[placement.account])
    except SlurmError:
        return wanted, None
    cap = parallel_cap(limits, placement.account, placement.qos, r.allocated_gpus)
    if cap is None or cap[0] >= wanted:
        return wanted, None
    return max(cap[0], 1), f"{max(cap[0], 1)} trials at once, not {wanted}: {cap[1]}"


def _early_stop(ledger: Ledger, client: SlurmClient, sweep: store.Sweep, rows: list[dict]) -> dict[int, str]:
    """Prune the trials the stopping rule dooms, cancelling their tasks. A trial pruned earlier whose task
    accounting still shows unfinished is cancelled again: a cancel lost on a busy controller must not leave a
    pruned trial holding its GPUs (scancel of a task that has ended meanwhile is no error)."""
    es = sweep.spec.early_stopping
    assert es is not None and es.metric is not None
    doomed: dict[int, str] = {}
    if any(r["state"] == "running" for r in rows):
        seen = [r["number"] for r in rows if r["state"] in ("running", "completed", "pruned")]
        doomed = trials_to_stop(sweep.spec, store.records(rows, store.intermediate(ledger, sweep, seen, es.metric)))
    unfinished = [r for r in rows if r["state"] == "pruned" and r["task_state"] not in (None, *TERMINAL)]
    by_number = {r["number"]: r for r in rows}
    cancel = [by_number[n] for n in doomed] + unfinished
    client.scancel([f"{r['slurm_job_id']}_{r['task_index']}" for r in cancel], harmless=CANCEL_ENDED)
    with ledger.transaction():
        for number, why in doomed.items():
            ledger.sweeps.prune(sweep.id, number, why)
            by_number[number]["state"] = "pruned"
    return doomed


def _retry_failed(ledger: Ledger, sweep: store.Sweep, rows: list[dict]) -> list[int]:
    """Failed trials with retries left become new again (same parameters, same number)."""
    again = [
        r
        for r in rows
        if r["state"] == "failed" and r["failures"] < sweep.spec.max_failures and r["job_id"] is not None
    ]
    ledger.sweeps.unlink(sweep.id, [r["number"] for r in again], failed=True)
    for r in again:
        r["state"] = "new"
    return [r["number"] for r in again]


def _submit_new(ledger: Ledger, client: SlurmClient, site: SiteConfig, sweep: store.Sweep, room: int) -> list[int]:
    """The first ``room`` new trials in one submission (arrays, split past MaxArraySize), each trial linked to
    its task in the transaction that records the task's job; the rest stay new for a later tick."""
    new = ledger.sweeps.new_trials(sweep.id)[: max(room, 0)]
    if not new:
        return []
    from hpctrain.config.job import ArraySpec  # only when trials are submitted: rendering's Jinja2 is 25 ms
    from hpctrain.submit import Submitter

    numbers = [r["number"] for r in new]
    job = sweep.job.model_copy(update={"array": ArraySpec(params=[json.loads(r["params_json"]) for r in new])})

    def link(job_id: int, chunk: ArrayChunk | None) -> None:
        assert chunk is not None
        ledger.sweeps.link(sweep.id, job_id, [(t, numbers[chunk.offset + t]) for t in range(chunk.count)])

    Submitter(site, ledger, client).submit(job, f"<sweep {sweep.id}>", sweep_id=sweep.id, on_record=link)
    return numbers


def _all_done(ledger: Ledger, sweep: store.Sweep) -> bool:
    finished, unfinished = ledger.sweeps.counts(sweep.id)
    return unfinished == 0 and finished >= (sweep.spec.max_trials or 0)
