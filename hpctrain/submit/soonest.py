"""Where a job would start soonest (`hpctrain where`, `submit --soonest`, issue 63).

The candidates are the placements the user may run a spec on: each partition of the site the spec fits, each account
the user has there (the spec's own when it names one; with account "auto", every account of the site, best fairshare
first), with their quota verdicts, under the spec's QOS (with `resources.preemptible = "allowed"`, under the site's
preemptible QOS too). Each gets one `sbatch --test-only` of its own batch script
(one partition a call: before 26.05.2 a test of several partitions was scored against the first), at most
MAX_CANDIDATES calls, each answer cached in the ledger for CACHE_S. The prediction blends Slurm's estimate with the
user's own waits for jobs alike in the ledger (same partition, account, QOS and GPUs over HISTORY_DAYS): a start
Slurm sees free now is Slurm's to say; a later one, which Slurm computes from the time limits of the jobs ahead,
moves toward the median past wait as the history grows (HISTORY_PRIOR waits weigh as much as Slurm). Each job placed
so keeps both starts in its placement event, and a ranking says how far off each has been for the user.
"""

from __future__ import annotations

import hashlib
import itertools
import statistics
import time
from dataclasses import dataclass, replace

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.config.types import format_slurm_time
from hpctrain.contract import JobPaths
from hpctrain.errors import ConfigError, HpctrainError, SlurmError
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.limits import cached
from hpctrain.submit.placement import Placement, check_resources, choose_placement, fairshare_standings
from hpctrain.submit.quota import WAITS_TO_START
from hpctrain.submit.render import render_script

MAX_CANDIDATES = 12  # `sbatch --test-only` calls for one ranking
CACHE_S = 30.0  # an estimate is reused this long (a status poll's interval)
HISTORY_DAYS = 30  # of waits alike, and of the errors of past predictions
HISTORY_PRIOR = 5  # past waits alike that weigh as much as Slurm's estimate
FREE_NOW_S = 60.0  # a start Slurm estimates within this is now


@dataclass(frozen=True)
class Candidate:
    """One placement and when the job would start there."""

    placement: Placement
    start: float | None  # predicted; None: after a limit on running jobs frees, with no history to say when
    slurm_start: float  # `sbatch --test-only`'s estimate
    nodes: str  # the nodes Slurm would give it
    waits: tuple[float, ...]  # the ledger's waits of jobs alike, newest first
    basis: str  # how the prediction was made, in words

    @property
    def name(self) -> str:
        return _named(self.placement)


@dataclass(frozen=True)
class Errors:
    """How far off the starts said were for the user's jobs placed by their start (`submit --soonest`)."""

    jobs: int
    predicted_s: float  # the median of |first start - predicted start|
    slurm_s: float  # the same for Slurm's estimate alone

    def words(self) -> str:
        return (
            f"over your last {self.jobs} submission(s) placed by their start, the prediction was off by "
            f"{duration(self.predicted_s)} and Slurm's estimate by {duration(self.slurm_s)} (medians)"
        )


@dataclass(frozen=True)
class Ranking:
    candidates: list[Candidate]  # soonest first; equal starts in the order of fairshare
    left_out: list[str]  # a line each: a partition the spec does not fit, an account that cannot run it, ...
    errors: Errors | None = None


def duration(seconds: float) -> str:
    """'now', '40 s', '25 min', '3.5 h', '2.0 days'."""
    if seconds < 1:
        return "now"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.1f} days"


def from_now(at: float | None, now: float) -> str:
    """'now', 'in 25 min', ...; 'after a limit' where the start is not known."""
    if at is None:
        return "after a limit"
    return "now" if at - now < 1 else f"in {duration(at - now)}"


def predict(
    slurm_start: float, waits: list[float] | tuple[float, ...], now: float, limits: tuple[str, ...] = ()
) -> tuple[float | None, str]:
    """The predicted start from Slurm's estimate, the past waits of jobs alike and the ``limits`` on running jobs
    the job would wait for (quota verdicts), and its basis in words. `sbatch --test-only` leaves those limits out
    (it answers "now" where the job would pend on QOSMaxGRESPerUser): with one, the history alone can say when."""
    alike = f"{len(waits)} job(s) alike waited {duration(statistics.median(waits))} (median)" if waits else ""
    if limits:
        held = "; ".join(w.removeprefix(WAITS_TO_START) for w in limits)
        if not waits:
            return None, f"waits for a limit: {held} (Slurm's estimate leaves limits out; no job alike in the ledger)"
        return max(slurm_start, now + statistics.median(waits)), f"history: waits for a limit: {held}; {alike}"
    if slurm_start <= now + FREE_NOW_S:
        return now, "Slurm: free now" + (f"; {alike}" if alike else "")  # its seconds are the scheduler's cycle
    if not waits:
        return slurm_start, f"Slurm: in {duration(slurm_start - now)} (no job alike in the ledger)"
    weight = len(waits) / (len(waits) + HISTORY_PRIOR)
    start = now + (1 - weight) * (slurm_start - now) + weight * statistics.median(waits)
    source = "history" if weight > 0.5 else "Slurm"
    return start, f"{source} ({weight:.0%} history): Slurm in {duration(slurm_start - now)}; {alike}"


def rank(
    spec: JobSpec,
    site: SiteConfig,
    client: SlurmClient,
    user: str,
    where: str,
    ledger: Ledger,
    now: float | None = None,
    fresh: bool = False,
) -> Ranking:
    """Every placement the user may run ``spec`` on, soonest first (see the module's docstring); ``fresh``: no
    estimate from the cache (a submission acts on them)."""
    now = time.time() if now is None else now
    placements, left_out = _placements(spec, site, client, user, where, ledger)
    if len(placements) > MAX_CANDIDATES:
        left_out += [
            f"{_named(p)}: not tested (at most {MAX_CANDIDATES} a ranking)" for p in placements[MAX_CANDIDATES:]
        ]
        placements = placements[:MAX_CANDIDATES]
    candidates = []
    for p in placements:
        runs = placed(spec, p)
        try:
            slurm_start, nodes = _estimate(runs, site, client, p, ledger, 0.0 if fresh else CACHE_S)
        except SlurmError as exc:
            left_out.append(f"{_named(p)}: {exc}")
            continue
        since = now - HISTORY_DAYS * 86400
        waits = tuple(
            ledger.jobs.waits_alike(site.name, p.partition, p.account, p.qos, runs.resources.allocated_gpus, since)
        )
        limits = tuple(w for w in p.waits if w.startswith(WAITS_TO_START))
        start, basis = predict(slurm_start, waits, now, limits)
        candidates.append(Candidate(p, start, slurm_start, nodes, waits, basis))
    # stable: the placements' order (fairshare, the spec's own QOS first) among equal starts
    candidates.sort(key=_soonest)
    found = ledger.events.start_errors(site.name, now - HISTORY_DAYS * 86400)
    errors = (
        Errors(len(found), statistics.median(abs(p) for p, _ in found), statistics.median(abs(s) for _, s in found))
        if found
        else None
    )
    return Ranking(candidates, left_out, errors)


def rank_sites(
    spec: JobSpec,
    sites: list[tuple[SiteConfig, SlurmClient]],
    user: str,
    where: str,
    ledger: Ledger,
    now: float | None = None,
    fresh: bool = False,
) -> Ranking:
    """`rank` over several clusters (a site config each) into one ranking, each candidate with its site; a cluster
    whose controller does not answer now (`scontrol ping`, before any estimate cached while it did) is left out in
    one line."""
    if len(sites) == 1:
        return rank(spec, sites[0][0], sites[0][1], user, where, ledger, now, fresh)
    candidates: list[Candidate] = []
    left_out: list[str] = []
    for site, client in sites:
        try:
            client.ping()
            ranking = rank(spec, site, client, user, where, ledger, now, fresh)
        except SlurmError as exc:
            left_out.append(f"site {site.name}: {'; '.join(str(exc).splitlines())}")
            continue
        candidates += [replace(c, placement=replace(c.placement, site=site.name)) for c in ranking.candidates]
        left_out += [f"site {site.name}: {line}" for line in ranking.left_out]
    return Ranking(sorted(candidates, key=_soonest), left_out)


def _soonest(c: Candidate) -> tuple[bool, float]:
    """Soonest first; a start not known (after a limit) last. Stable: equal starts keep their order."""
    return c.start is None, c.start or 0.0


def _on(spec: JobSpec, shape: int | None, chunk: int | None) -> JobSpec:
    """``spec`` on ``shape`` nodes (one of its shapes) in runs of ``chunk`` seconds (one of its time chunks), where
    given."""
    on = spec.shaped(shape) if shape is not None else spec
    return on if chunk is None else on.model_copy(update={"resources": on.resources.model_copy(update={"time": chunk})})


def placed(spec: JobSpec, placement: Placement) -> JobSpec:
    """``spec`` as ``placement`` runs it: on its shape, in runs of its chunk, in its partition and account."""
    on = _on(spec, placement.shape, placement.chunk)
    where = {"partition": placement.partition, "account": placement.account}
    return on.model_copy(update={"resources": on.resources.model_copy(update=where)})


def as_submitted(spec: JobSpec, placement: Placement, site: SiteConfig) -> JobSpec:
    """``spec`` as submitted to ``placement``: on its shape, and keeping the spec's other shapes the partition holds,
    so that Slurm starts the job, and starts it again after a requeue, on as many nodes as are free then (sbatch's
    node range: `Resources.slurm_nodes`; the trainer takes the shape it was given: `JobSpec.on_nodes`)."""
    one, shapes = placed(spec, placement), spec.resources.shapes
    if not shapes or placement.shape is None:
        return one
    room = site.partitions[placement.partition].nodes
    held = [n for n in shapes if room is None or n + spec.resources.spare_nodes <= room]
    return one.model_copy(
        update={"resources": one.resources.model_copy(update={"shapes": held if len(held) > 1 else None})}
    )


def refused(ranking: Ranking, where: str) -> HpctrainError:
    """The one line saying why no placement can run the spec at ``where``."""
    return HpctrainError(f"{where}: no placement can run it: " + "; ".join(ranking.left_out))


def chosen(ranking: Ranking, where: str, now: float | None = None) -> Placement:
    """The soonest candidate's placement, its reason saying why (for `submit --soonest`)."""
    if not ranking.candidates:
        raise refused(ranking, where)
    now = time.time() if now is None else now
    best, others = ranking.candidates[0], ranking.candidates[1:]
    beaten = "; ".join(f"{c.name} {from_now(c.start, now)}" for c in others) or "no other candidate"
    return replace(
        best.placement,
        reason=f"soonest: {best.name} {from_now(best.start, now)} ({best.basis}) over {beaten}",
        starts=(best.start, best.slurm_start),
    )


def _named(p: Placement) -> str:
    return (f"{p.site}: " if p.site else "") + f"{p.partition}/{p.qos} as {p.account}{_on_words(p.shape, p.chunk)}"


def _on_words(shape: int | None, chunk: int | None) -> str:
    """ " on 2 node(s) in runs of 00:30:00", of what is given."""
    on = f" on {shape} node(s)" if shape is not None else ""
    return on + (f" in runs of {format_slurm_time(chunk)}" if chunk is not None else "")


def _placements(
    spec: JobSpec, site: SiteConfig, client: SlurmClient, user: str, where: str, ledger: Ledger
) -> tuple[list[Placement], list[str]]:
    """The placements that may run the spec, the spec's own partition first; and a line for each left out."""
    own = spec.resources.partition or site.defaults.partition
    account = spec.resources.account or site.defaults.account
    if account == "auto":
        standings = fairshare_standings(client, user)
        accounts = sorted(site.accounts, key=lambda a: standings[a].key() if a in standings else (0.0,) * 3)[::-1]
    else:
        accounts = [account]
    shapes = spec.resources.shapes
    placements, left_out = [], []
    for partition, nodes, chunk in itertools.product(
        sorted(site.partitions, key=lambda p: p != own), spec.resources.node_counts, _chunks(spec, site)
    ):
        shaped = _on(spec, nodes, chunk)
        on = _on_words(nodes if shapes else None, chunk)
        try:
            check_resources(shaped, site, partition, where)
        except ConfigError as exc:
            left_out.append(f"partition {partition}{on}: {_last_part(exc)}")
            continue
        for name, (qos, choice) in itertools.product(accounts, _qos_choices(spec)):
            resources = shaped.resources.model_copy(update={"partition": partition, "account": name, **choice})
            try:
                placement = choose_placement(
                    shaped.model_copy(update={"resources": resources}), site, client, user, where, ledger
                )
            except ConfigError as exc:
                left_out.append(f"{partition}{qos}{on} as {name}: {_last_part(exc)}")
                continue
            placements.append(replace(placement, shape=nodes if shapes else None, chunk=chunk))
    return placements, left_out


def _chunks(spec: JobSpec, site: SiteConfig) -> list[int | None]:
    """The time limits the spec may run in: its own (None), and each of its `time_chunks` shorter than that."""
    whole = spec.resources.time or site.defaults.time
    return [None, *(c for c in spec.resources.time_chunks or () if c < whole)]


def _qos_choices(spec: JobSpec) -> list[tuple[str, dict[str, object]]]:
    """The QOS the spec may run in, as (a label for a refusal, the change to its resources): its own; with
    `resources.preemptible = "allowed"`, its own and the site's preemptible one."""
    if spec.resources.preemptible != "allowed":
        return [("", {})]
    return [("", {"preemptible": False}), (" in the preemptible QOS", {"qos": None, "preemptible": True})]


def _last_part(exc: ConfigError) -> str:
    """A placement problem without the spec file it names: 'resources.time: 02:00:00 requested, ...'."""
    return "; ".join(line.split(": ", 1)[-1] for line in str(exc).splitlines())


def _estimate(
    spec: JobSpec, site: SiteConfig, client: SlurmClient, placement: Placement, ledger: Ledger, max_age_s: float
) -> tuple[float, str]:
    """Slurm's estimate of the start of the spec's batch script in ``placement`` (an array's: one task's), from the
    cache when at most ``max_age_s`` old."""
    script = render_script(spec, site, placement, JobPaths(site.paths.logs / f"{spec.name}-TESTONLY"), "TESTONLY")
    key = "test-only:" + hashlib.sha256(script.encode()).hexdigest()
    start, nodes = cached(site, ledger, key, max_age_s, lambda: client.test_only(script, spec.secret_names()))
    return float(start), str(nodes)
