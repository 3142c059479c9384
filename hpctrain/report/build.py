"""The reports: a job, a sweep, or accounts' GPU-hours, each as one self-contained HTML page."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from hpctrain.config import SiteConfig
from hpctrain.contract import EVAL_LOSS
from hpctrain.errors import HpctrainError
from hpctrain.jobs import stragglers
from hpctrain.jobs.accounting import Total, Usage, overall, percent, summary, totals, usage
from hpctrain.jobs.goodput import GPU_CAUSES
from hpctrain.jobs.gpus import gpu_use, gpus_line
from hpctrain.jobs.shard_cache import cache_counts, cache_words
from hpctrain.ledger import Ledger
from hpctrain.ledger.attempts import outcome
from hpctrain.ledger.evaluations import outcome as evaluation_outcome
from hpctrain.report import collect
from hpctrain.report.page import Plot, Table, render
from hpctrain.report.plots import Series, lines, stacked_bars
from hpctrain.slurm.assoc_mgr import Limit

MAX_LINES = 20  # curves in one plot; more would be unreadable
MAX_LOSS_FACTS = 4  # curves whose first and last loss the facts give


def job_report(ledger: Ledger, site_cfg: SiteConfig, job_id: int, data: collect.JobData | None = None) -> str:
    """A job: facts, GPU-hours, attempts, environment (secrets redacted), and its loss, throughput,
    checkpoint duration and data wait by step (one curve per array task); ``data``: the job's, if read already."""
    data = data or collect.job_data(ledger, job_id)
    job, metrics = data.job, data.metrics
    loss, eval_loss = metrics.get("loss", {}), metrics.get(EVAL_LOSS, {})
    facts = [
        ("job", f"{job['name']} (ledger id {job['id']}, slurm job {job['slurm_job_id'] or '-'})"),
        ("state", job["state"]),
        ("account / QOS", f"{job['account'] or '-'} / {job['qos'] or '-'}"),
        ("partition", job["partition"] or "-"),
        ("user", job["user"] or "-"),
        ("submitted", _when(job["submitted_at"])),
        ("attempts", f"{len(data.attempts)} ({_counts(a['cause'] or a['state'] or '-' for a in data.attempts)})"),
        ("checkpoints", f"{len(data.checkpoints)} ({_counts(c['state'] for c in data.checkpoints)})"),
        *_usage_facts(overall(totals(runs := _usage(ledger, site_cfg, job_id=job_id), "job"))),
        *_loss_facts(loss),
        *_loss_facts(eval_loss, EVAL_LOSS),
    ]
    if job["sweep_id"]:
        facts.append(("sweep", job["sweep_id"]))
    if use := gpu_use(ledger.gpus.of_job(job_id)):
        facts.append(("GPU use", gpus_line(use)))
    if cached := cache_counts(ledger, job_id):
        facts.append(("shards", cache_words(cached)))
    if slow := stragglers.latest(ledger, job_id):
        facts.append(("stragglers", f"at step {slow[0]}: {', '.join(map(str, slow[1])) or 'none'}"))
    plots = [
        _loss_plot(loss, eval_loss, collect.attempt_marks(data.attempts)),
        _plot("throughput (tokens/s) vs step", "tokens/s", _labelled(metrics.get("tokens_per_s", {}))),
        _plot(
            "checkpoint duration vs step",
            "seconds",
            _labelled(collect.checkpoint_durations(data.checkpoints)),
            points=True,
        ),
        _plot("data wait vs step", "seconds per step", _labelled(metrics.get("data_wait_s", {}))),
        *_gpu_plots(ledger, job_id),
        _causes_plot(
            runs,
            lambda u: f"{'' if u.task_index < 0 else f'task {u.task_index} '}attempt {u.attempt}",
            "GPU-hours by cause per attempt",
            "attempt",
        ),
    ]
    attempts = Table(
        "attempts",
        [
            "task",
            "attempt",
            "state",
            "cause",
            "started",
            "ended",
            "GPUs",
            "ckpt step at start",
            "ckpt step at end",
            "then",
        ],
    )
    for a in data.attempts:
        then = a["decision"] or outcome(a)
        attempts.rows.append(
            [
                _or_dash(a["task_index"] if a["task_index"] >= 0 else None),
                a["attempt"],
                a["state"] or "-",
                a["cause"] or "-",
                _when(a["started_at"]),
                _when(a["ended_at"]),
                _or_dash(a["alloc_gpus"]),
                _or_dash(a["step_start"]),
                _or_dash(a["step_end"]),
                then,
            ]
        )
    env = Table("environment", ["name", "value"], [[k, v] for k, v in data.env.items()])
    evaluations = Table("evaluations of checkpoints", ["task", "step", "evaluator", "state", "eval job", "values"])
    for e in data.evaluations:
        task = e["task_index"] if e["task_index"] >= 0 else None
        evaluations.rows.append(
            [_or_dash(task), e["step"], e["evaluator"], e["state"], _or_dash(e["eval_job_id"]), evaluation_outcome(e)]
        )
    return render(
        f"job {job['id']}: {job['name']}", facts, plots, [attempts, *([evaluations] * bool(data.evaluations)), env]
    )


def loss_summary(data: collect.JobData) -> list[str]:
    """The job report's loss facts as lines ("loss: 5.545 at step 1 → 1.71 at step 400 (smoothed 1.74)"), the
    held-out loss's after them."""
    facts = [*_loss_facts(data.metrics.get("loss", {})), *_loss_facts(data.metrics.get(EVAL_LOSS, {}), EVAL_LOSS)]
    return [f"{name}: {value}" for name, value in facts]


def sweep_report(ledger: Ledger, site_cfg: SiteConfig, sweep_id: str) -> str:
    """A sweep: facts, the best trial, its metric by trial and by step, parameter importance, every trial."""
    from hpctrain.report.sweep_plots import importance_png, metric_png
    from hpctrain.sweep import store

    swp = store.load(ledger, sweep_id)
    spec = swp.spec
    rows = store.trial_table(ledger, swp)
    top = store.best(rows, spec.direction)
    steps = store.intermediate(ledger, swp, [r["number"] for r in rows], spec.metric)
    curves = {n: (sorted(c), [c[s] for s in sorted(c)]) for n, c in steps.items() if c}
    facts = [
        ("sweep", f"{swp.id} ({spec.method}, {swp.state})"),
        ("metric", f"{spec.direction} {spec.metric}"),
        (
            "trials",
            f"{len(rows)}{f' of at most {spec.max_trials}' if spec.max_trials else ''} "
            f"({_counts(r['state'] for r in rows)})",
        ),
        (
            "best trial",
            f"trial {top['number']}: {spec.metric} = {top['value']:.6g}, {json.dumps(top['params'], sort_keys=True)}"
            if top
            else store.no_best(rows, spec.metric),
        ),
        *_usage_facts(overall(totals(_usage(ledger, site_cfg, sweep_id=swp.id), "sweep"))),
    ]
    plots = [
        Plot(f"{spec.metric} by trial", metric_png(spec, rows) if top else None),
        Plot("parameter importance", *importance_png(spec, rows)),
        _plot(f"{spec.metric} vs step", spec.metric, _labelled(curves, "trial")),
    ]
    trials = Table(
        "trials",
        ["trial", "parameters", "state", spec.metric, "GPU-hours", "note"],
        [
            [
                r["number"],
                json.dumps(r["params"], sort_keys=True),
                r["state"],
                "-" if r["value"] is None else f"{r['value']:.6g}",
                f"{r['gpu_hours']:.2f}",
                r["reason"] or (f"{r['failures']} failure(s)" if r["failures"] else ""),
            ]
            for r in rows
        ],
    )
    return render(f"sweep {swp.id}", facts, plots, [trials])


def account_report(
    ledger: Ledger,
    site_cfg: SiteConfig,
    account: str | None = None,
    since: float | None = None,
    budgets: dict[str, Limit] | None = None,
) -> str:
    """GPU-hours, lost GPU-hours and cost of one account (None: every account) since a time, with the
    cumulative GPU-hours of each account over time (each run's hours spread evenly over its run time) and,
    for accounts in ``budgets`` (their GPU-minute limits), the budget as a dashed line beside them."""
    now = time.time()
    got = summary(ledger, site_cfg.name, site_cfg.gpu_hour_price, since, now, account)
    if account is not None and not got.totals and not ledger.jobs.has_account(site_cfg.name, account):
        raise HpctrainError(f"account {account!r}: no jobs of site {site_cfg.name!r} in the ledger")
    series = {name: ([datetime.fromtimestamp(t) for t in times], hours) for name, (times, hours) in got.curves.items()}
    every = overall(got.totals)
    facts = [
        ("site", site_cfg.name),
        ("period", f"{_when(since) if since else 'all time'} to {_when(now)}"),
        ("runs", f"{every.runs} ({len(every.jobs)} jobs)"),
        *_usage_facts(every),
    ]
    budgets = {name: b for name, b in (budgets or {}).items() if account in (None, name)}
    start = min((t[0] for t, _ in series.values()), default=datetime.fromtimestamp(since or now))
    for name, budget in budgets.items():
        series[f"{name} budget"] = ([start, datetime.fromtimestamp(now)], [budget.limit / 60] * 2)
        facts.append(
            (
                f"budget {name}",
                f"{budget.limit / 60:.1f} GPU-hours, {budget.used / 60:.1f} spent as Slurm "
                f"counts it (all users, decayed), {budget.left / 60:.1f} left",
            )
        )
    plot = _plot(
        "cumulative GPU-hours per account",
        "GPU-hours",
        series,
        xlabel="time",
        note="each run's GPU-hours are spread evenly over its run time"
        + ("; dashed level: the account's GPU-minute budget (GrpTRESMins)" if budgets else ""),
        dashed=[f"{name} budget" for name in budgets],
    )
    days = list(got.days)
    causes = _causes_bars(
        days,
        {c: [got.days[d][c] for d in days] for c in GPU_CAUSES},
        "GPU-hours by cause per day (runs by the day they started)",
        "day",
    )
    table = Table(
        "by account",
        ["account", "jobs", "runs", "GPU-hours", "lost GPU-hours", "goodput", "cost"],
        [
            [
                t.key or "-",
                len(t.jobs),
                t.runs,
                f"{t.gpu_hours:.2f}",
                f"{t.lost_gpu_hours:.2f}",
                percent(t.goodput),
                f"{t.cost:.2f}",
            ]
            for t in got.totals
        ],
    )
    return render(
        f"GPU-hours: account {account}" if account else "GPU-hours: all accounts", facts, [plot, causes], [table]
    )


def _plot(title: str, ylabel: str, series: Series, xlabel: str = "step", note: str = "", **style: Any) -> Plot:
    """The series as one plot (``style``: ``lines``' keywords), at most MAX_LINES of them; "no data" when there
    are none."""
    if not series:
        return Plot(title, None)
    if len(series) > MAX_LINES:
        note = "; ".join(filter(None, [note, f"the first {MAX_LINES} of {len(series)} curves shown"]))
        series = dict(list(series.items())[:MAX_LINES])
    return Plot(title, lines(series, title, xlabel, ylabel, **style), note)


def _gpu_plots(ledger: Ledger, job_id: int) -> list[Plot]:
    """Each GPU's utilization and memory over time, as its node's sampler read them (hpctrain.runtime.utilization)."""
    util, mem = collect.gpu_curves(ledger.gpus.timeline(job_id))
    note = "a point a minute (fewer once the job has settled); none: the job's GPUs were not sampled"
    return [
        _plot("GPU utilization over time", "percent", util, xlabel="time", note=note),
        _plot("GPU memory over time", "MiB (peak)", mem, xlabel="time", note=note),
    ]


def _loss_plot(loss: collect.Curves, eval_loss: collect.Curves, marks: list[tuple[int, int, str]]) -> Plot:
    """Training loss by step, smoothed over the faint raw values, the held-out loss as markers, with a dashed line
    at the step each resumed attempt began from (labelled with its task in an array)."""
    evaluated = {" ".join(filter(None, (EVAL_LOSS, label))): c for label, c in _labelled(eval_loss).items()}
    return _plot(
        "loss vs step",
        "loss",
        _labelled(loss),
        smooth=collect.smoothed,
        sparse=dict(list(evaluated.items())[:MAX_LINES]),
        mark_legend="attempt began",
        marks=[(step, label if task < 0 else f"task {task}: {label}") for task, step, label in marks],
        note="faint: the raw training values; solid: their exponential moving average"
        + ("; markers: the held-out loss" if evaluated else ""),
    )


def _loss_facts(loss: collect.Curves, name: str = "loss") -> list[tuple[str, str]]:
    """'4.242 at step 1 → 0.6427 at step 50 (smoothed 0.6581)' for each curve ("loss (task 3)" in an array), none
    for more than MAX_LOSS_FACTS curves; a held-out curve (sparse) gives its best instead of a smoothed value."""
    if len(loss) > MAX_LOSS_FACTS:
        return []
    facts = []
    for label, (xs, ys) in _labelled(loss).items():
        then = (
            f"best {min(ys):.4g} at step {xs[ys.index(min(ys))]}"
            if name == EVAL_LOSS
            else f"smoothed {collect.smoothed(ys)[-1]:.4g}"
        )
        facts.append(
            (
                f"{name} ({label})" if label else name,
                f"{ys[0]:.4g} at step {xs[0]} → {ys[-1]:.4g} at step {xs[-1]} ({then})",
            )
        )
    return facts


def _labelled(curves: collect.Curves, label: str = "task") -> Series:
    """Curves by task (or trial) number, labelled "task 3"; a plain job's single curve (-1) unlabelled."""
    return {("" if key < 0 else f"{label} {key}"): curves[key] for key in sorted(curves)}


def _usage(ledger: Ledger, site_cfg: SiteConfig, **which: Any) -> list[Usage]:
    return usage(ledger, site_cfg.name, site_cfg.gpu_hour_price, **which)


def _usage_facts(total: Total) -> list[tuple[str, str]]:
    return [
        ("GPU-hours", f"{total.gpu_hours:.2f}"),
        ("lost GPU-hours", f"{total.lost_gpu_hours:.2f} (work redone after interruptions)"),
        (
            "goodput",
            f"{percent(share)} of the GPU time of runs whose trainer journals its steps"
            if (share := total.goodput) is not None
            else "- (no run's trainer journals its steps)",
        ),
        ("cost", f"{total.cost:.2f}"),
    ]


def _causes_plot(runs: list[Usage], label: Callable[[Usage], str], title: str, xlabel: str) -> Plot:
    return _causes_bars(*collect.gpu_hours_by_cause([u for u in runs if u.measured], label), title, xlabel)


def _causes_bars(bars: list[str], stacks: dict[str, list[float]], title: str, xlabel: str) -> Plot:
    if not bars:
        return Plot(title, None, "no run's trainer journals its steps")
    return Plot(
        title,
        stacked_bars(bars, stacks, title, xlabel, "GPU-hours"),
        "productive: training steps kept; the rest lost: see `hpctrain cost --causes`",
    )


def _counts(values: Any) -> str:
    """'3 completed, 1 preemption': how often each value occurs, most frequent first."""
    return ", ".join(f"{n} {value}" for value, n in Counter(values).most_common()) or "none"


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"
