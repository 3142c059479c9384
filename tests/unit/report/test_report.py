"""`hpctrain report`: self-contained HTML pages whose embedded PNG plots show the ledger's data, checked in the
HTML, in the decoded images, and in a headless Chromium screenshot."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.report import account_report, job_report, sweep_report
from hpctrain.report.collect import attempt_marks, smoothed
from hpctrain.slurm.assoc_mgr import Limit
from hpctrain.sweep import store
from hpctrain.sweep.spec import load_sweep_spec

from helpers.cli import run_cli
from helpers.report import (CHROMIUM, assert_marks_at, chromium, colour_mask, mark_columns, mark_steps, page_marks,
                            pixels, plot_images, screenshot)

C0 = (0x1F, 0x77, 0xB4)  # matplotlib's first line colour
SECRET = "hunter2-never-shown"
JOB_PLOTS = {"loss vs step", "throughput (tokens/s) vs step", "checkpoint duration vs step", "data wait vs step",
             "GPU-hours by cause per attempt", "GPU utilization over time", "GPU memory over time"}
SWEEP = """
name = "lr-sweep"
method = "random"
metric = "loss"
direction = "minimize"
max_trials = 6
[search]
lr = { type = "loguniform", low = 1e-4, high = 1e-1 }
[job]
name = "trial"
command = ["python", "train.py"]
"""
T0 = time.time() - 3 * 86400
# The plain job's runs: (start h, end h, cause, (checkpoint step resumed from, last checkpoint step)), and the hour
# each checkpoint was written: each interrupted run loses the 0.1 h after its last checkpoint.
RUNS = [(0, 0.5, "preemption", (None, 10)), (0.55, 1.0, "preemption", (10, 20)), (1.05, 1.6, "timeout", (20, 40)),
        (1.65, 2.05, "completed", (40, 50))]
CHECKPOINT_HOURS = {10: 0.4, 20: 0.9, 30: 1.2, 40: 1.5, 50: 2.0}
MARK_STEPS = [10, 20, 40]  # where attempts 2, 3 and 4 began


def _job(ledger: Ledger, name: str, account: str, spec: dict, **fields: object) -> int:
    return Table(ledger, "jobs").insert({"name": name, "site": "dev", "user": "alice", "account": account,
                                         "partition": "gpu", "qos": "normal", "state": "COMPLETED", "submitted_at": T0,
                                         "spec_json": spec, **fields})


def _attempt(ledger: Ledger, job_id: int, task: int, attempt: int, start_h: float, end_h: float, cause: str,
             steps: tuple[int | None, int]) -> None:
    ledger.attempts.record(
        job_id, task, attempt, state="COMPLETED" if cause == "completed" else "PREEMPTED", cause=cause,
        started_at=T0 + start_h * 3600, ended_at=T0 + end_h * 3600, alloc_gpus=4,
        elapsed_s=int((end_h - start_h) * 3600), step_start=steps[0], step_end=steps[1],
        requeued=int(cause != "completed"), decision=None)


def _loss(step: int, task: int) -> float:
    return 4 * math.exp(-step / 15) + 0.5 + 0.05 * task


def _metrics(ledger: Ledger, job_id: int, task: int, names: tuple[str, ...], steps: int = 50) -> None:
    curve = {"loss": lambda s: _loss(s, task), "step_time_s": lambda s: 0.3,
             "tokens_per_s": lambda s: 12000 + 300 * (s % 7), "data_wait_s": lambda s: 0.01 + 0.002 * (s % 5)}
    ledger.db.table("metrics").insert_all(
        {"job_id": job_id, "task_index": task, "name": n, "step": s, "value": curve[n](s), "attempt": 1,
         "time": T0 + s * 60} for n in names for s in range(1, steps + 1))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A ledger with a job preempted twice and timed out once (and resumed each time), an array job of another
    account and a sweep; every report."""
    tmp = tmp_path_factory.mktemp("report")
    site = load_site("dev").model_copy(update={"gpu_hour_price": {"gpu": 2.0}})
    spec = JobSpec.model_validate({"name": "gpt-small", "command": ["python", "-m", "hpctrain.train"],
                                   "env": {"API_KEY": {"value": SECRET, "secret": True}, "MODE": "visible-value"}})
    with Ledger(tmp / "ledger.db") as ledger:
        job = _job(ledger, "gpt-small", "teama", spec.redacted(), slurm_job_id="101")
        for attempt, (start_h, end_h, cause, steps) in enumerate(RUNS, 1):
            _attempt(ledger, job, -1, attempt, start_h, end_h, cause, steps)
            # Its trainer's start, steps (the second run's last 5 done again by the third) and stop, a minute each.
            Table(ledger, "segments").insert({
                "job_id": job, "task_index": -1, "attempt": attempt, "main_at": T0 + start_h * 3600 + 60,
                "loaded_at": T0 + start_h * 3600 + 120, "resumed_from": steps[0] or 0, "steps": 10,
                "step_seconds": (end_h - start_h) * 3600 - 240, "last_step": steps[1] + 5 * (attempt == 2),
                "last_step_at": T0 + end_h * 3600 - 60})
        _metrics(ledger, job, -1, ("loss", "tokens_per_s", "data_wait_s", "step_time_s"))
        _gpus(ledger, job)
        for step, outcome in ((40, {"eval/loss": 2.25}), (50, "evaluator ppl: exited 3")):
            ledger.evaluations.request(job, -1, step, "heldout", f"/ck/step_{step}")
            if isinstance(outcome, dict):
                ledger.evaluations.done(job, -1, step, "heldout", outcome, at=T0)
            else:
                ledger.evaluations.failed(job, -1, step, "heldout", outcome, at=T0)
        for step, hour in CHECKPOINT_HOURS.items():
            ledger.checkpoints.record({"job_id": job, "step": step, "path": f"/ck/step_{step}", "state": "committed",
                                       "created_at": T0 + hour * 3600, "bytes": 10**9, "duration_s": 2 + step / 10})
        # A row as an old hpctrain might have written it, the secret's value in it: the report redacts it again.
        array = _job(ledger, "gpt-array", "teamb", spec.model_dump(mode="json"), slurm_job_id="102", is_array=1)
        for task in range(3):
            _attempt(ledger, array, task, 1, 24 + task, 30 + task, "completed", (None, 50))
            _metrics(ledger, array, task, ("loss",))

        path = tmp / "sweep.toml"
        path.write_text(SWEEP)
        swp, _ = store.register(ledger, load_sweep_spec(path), path)
        trials = _job(ledger, "trial", "teama", swp.job.redacted(), slurm_job_id="103", is_array=1, sweep_id=swp.id)
        for n, lr in enumerate((1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)):
            Table(ledger, "trials").insert({"sweep_id": swp.id, "number": n, "params_json": {"lr": lr},
                                            "state": "completed", "job_id": trials, "task_index": n,
                                            "value": 1 + abs(math.log10(lr) + 2.5)})
            _attempt(ledger, trials, n, 1, 40, 41, "completed", (None, 20))
            _metrics(ledger, trials, n, ("loss",), steps=20)

        html = {"job": job_report(ledger, site, job), "array": job_report(ledger, site, array),
                "sweep": sweep_report(ledger, site, swp.id), "accounts": account_report(ledger, site, None, None),
                "teamb": account_report(ledger, site, "teamb", None)}
    files = {}
    for name, text in html.items():
        files[name] = tmp / f"{name}.html"
        files[name].write_text(text)
    return {"html": html, "files": files, "ledger": tmp / "ledger.db", "site": site, "ids": (job, array)}


def _gpus(ledger: Ledger, job: int) -> None:
    """The last run's four GPUs, sampled for an hour: GPU 0 at about 90 % with 20-30 GiB, GPUs 1-3 idle with 1-2 GiB."""
    start = T0 + RUNS[-1][0] * 3600
    busy = {"samples": 720, "seconds": 3600.0, "mean": 90.0, "p10": 80.0, "mem_peak": 30.0 * 2**30,
            "mem_total": 80.0 * 2**30, "idle_s": 0.0, "idle_now_s": 0.0}
    idle = {**busy, "mean": 0.0, "p10": 0.0, "mem_peak": 2.0**30, "idle_s": 3540.0, "idle_now_s": 3540.0}
    points = [(start + 60 * m, d, 90 + 8 * math.sin(m / 3) if d == "0" else 1 + math.sin(m / 2 + int(d)),
               (20 + m / 6 if d == "0" else 1 + m / 60) * 2**30) for m in range(60) for d in "0123"]
    ledger.gpus.record({"job_id": job, "task_index": -1, "attempt": len(RUNS), "step_restart": 0}, "n1", "nvml",
                       {"0": busy, "1": idle, "2": idle, "3": idle}, {"below_percent": 5, "after_s": 60, "alert_s": 600},
                       points, start + 3600, True)


def _colour_count(image, colour: tuple[int, int, int]) -> int:
    return int(colour_mask(image, colour).sum())


@pytest.mark.parametrize("name", ["job", "array", "sweep", "accounts", "teamb"])
def test_every_report_is_one_self_contained_page(reports, name):
    html = reports["html"][name]
    assert html.startswith("<!DOCTYPE html>") and "<title>" in html
    assert not re.search(r"https?://|\b(?:src|href)=\"(?!data:)", html), "the page loads something from outside"
    assert len(plot_images(html)) == html.count("<img ")


def test_job_report_plots_loss_throughput_checkpoints_and_data_wait(reports):
    html = reports["html"]["job"]
    images = plot_images(html)
    assert set(images) == JOB_PLOTS
    for alt, png in images.items():
        image = pixels(png)
        assert image.std() > 0, f"{alt}: blank image"
        assert _colour_count(image, C0) > 100, f"{alt}: no plotted data in C0"
    assert "<title>job 1: gpt-small</title>" in html
    assert "4 (2 preemption, 1 timeout, 1 completed)" in html
    assert "5 (5 committed)" in html
    # 4 GPUs x 1.9 h over 4 runs at 2.0 per GPU-hour; 3 x 0.1 h after the interrupted runs' last checkpoints is lost.
    assert "<td>7.60</td>" in html and "<td>15.20</td>" in html and "<td>1.20 (work redone" in html
    # Steps took all but 4 minutes of each run's 6840 s; the second run's last 5 of 10 were done again: 690 s.
    assert "<td>75.9% of the GPU time of runs whose trainer journals its steps</td>" in html
    causes = pixels(images["GPU-hours by cause per attempt"])
    assert _colour_count(causes, (0xFF, 0x7F, 0x0E)) > 100  # C1: recomputed, on the second attempt's bar


def test_job_report_shows_each_gpus_use_and_memory_over_time(reports):
    html = reports["html"]["job"]
    assert "<th>GPU use</th><td>GPUs (nvml) 22 % on average: 0 90 %, 1 0 %, 2 0 %, 3 0 %; peak memory 30.0 of 80 GiB" in html
    images = plot_images(html)
    for alt in ("GPU utilization over time", "GPU memory over time"):
        image = pixels(images[alt])
        for colour in (C0, (0xD6, 0x27, 0x28)):  # GPU 0's line, and GPU 3's (C3) over 1's and 2's
            assert _colour_count(image, colour) > 100, alt
    assert "GPU utilization over time" not in plot_images(reports["html"]["array"])  # not sampled: no data


def test_loss_plot_marks_the_step_each_resumed_attempt_began_from(reports):
    images = plot_images(reports["html"]["job"])
    loss = pixels(images["loss vs step"])
    assert_marks_at(mark_columns(loss), MARK_STEPS)
    assert mark_steps(loss, 1, 50) == pytest.approx(MARK_STEPS, abs=0.25)
    for alt in JOB_PLOTS - {"loss vs step"}:
        assert mark_columns(pixels(images[alt])) == [], alt
    assert mark_columns(pixels(plot_images(reports["html"]["array"])["loss vs step"])) == []  # no task was resumed


def test_attempt_marks_of_resumed_attempts_only():
    def row(task: int, attempt: int, cause: str | None, step_start: int | None) -> dict[str, object]:
        return {"task_index": task, "attempt": attempt, "cause": cause, "step_start": step_start}

    rows = [row(0, 1, "node_failure", None), row(0, 2, "preemption", 30), row(0, 3, None, None), row(0, 4, None, 60),
            row(1, 5, "completed", 80), row(2, 1, "preemption", None), row(2, 2, "completed", 20)]
    assert attempt_marks(rows) == [(0, 30, "attempt 2 after node failure"), (0, 60, "attempt 4"),
                                   (2, 20, "attempt 2 after preemption")]


def test_loss_fact_gives_the_first_and_last_loss(reports):
    losses = [_loss(step, -1) for step in range(1, 51)]
    assert (f"<th>loss</th><td>{losses[0]:.4g} at step 1 → {losses[-1]:.4g} at step 50 "
            f"(smoothed {smoothed(losses)[-1]:.4g})</td>") in reports["html"]["job"]
    assert reports["html"]["array"].count("<th>loss (task ") == 3


def test_smoothing_is_a_bias_corrected_moving_average():
    assert smoothed([5.0, 1.0, 3.0]) == [5.0, 1.0, 3.0]  # a span of 1 for so short a curve
    assert smoothed([2.5] * 200) == pytest.approx([2.5] * 200)
    assert smoothed([4.0, 0.0], span=3) == pytest.approx([4.0, 4 / 3])  # starts at the first value, not at 4 / 2
    step = smoothed([0.0] * 50 + [1.0] * 150)  # a span of 10
    assert step[:50] == [0.0] * 50 and 0 < step[50] < 0.5
    assert step[50:] == sorted(step[50:]) and step[-1] == pytest.approx(1.0)
    zigzag = smoothed([(-1.0) ** i for i in range(200)])
    assert max(zigzag[100:]) - min(zigzag[100:]) < 0.25  # of 2: the noise smoothed away


def test_array_job_has_a_curve_per_task_and_says_no_data_for_missing_metrics(reports):
    html = reports["html"]["array"]
    assert set(plot_images(html)) == {"loss vs step"}
    assert html.count("no data") == 6 and "no run&#39;s trainer journals its steps" in html
    image = pixels(plot_images(html)["loss vs step"])
    for colour in (C0, (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C)):  # C0, C1, C2: one line per task
        assert _colour_count(image, colour) > 100


def test_sweep_report_shows_the_best_trial_and_its_plots(reports):
    html = reports["html"]["sweep"]
    assert set(plot_images(html)) == {"loss by trial", "parameter importance", "loss vs step"}
    assert "trial 3: loss = 1.02" in html and "6 of at most 6 (6 completed)" in html
    for png in plot_images(html).values():
        assert pixels(png).std() > 0


def test_account_report_totals_and_cumulative_gpu_hours(reports):
    every, teamb = reports["html"]["accounts"], reports["html"]["teamb"]
    assert set(plot_images(every)) == {"cumulative GPU-hours per account", "GPU-hours by cause per day (runs by the day "
                                                                          "they started)"}
    assert set(plot_images(teamb)) == {"cumulative GPU-hours per account"}
    assert "<td>teama</td>" in every and "<td>teamb</td>" in every
    assert "<td>teama</td>" not in teamb and "GPU-hours: account teamb" in teamb
    assert "<td>72.00</td>" in teamb  # 3 tasks x 4 GPUs x 6 h
    image = pixels(plot_images(every)["cumulative GPU-hours per account"])
    assert _colour_count(image, C0) > 100 and _colour_count(image, (0xFF, 0x7F, 0x0E)) > 100


def test_an_account_budget_is_a_fact_and_a_dashed_level(reports):
    budgets = {"teamb": Limit("account teamb", "GPU-minutes", "GrpTRESMins:gres/gpu", 6000, 1200, "spent"),
               "teama": Limit("account teama", "GPU-minutes", "GrpTRESMins:gres/gpu", 60, 0, "spent")}
    with Ledger(reports["ledger"]) as ledger:
        page = account_report(ledger, reports["site"], "teamb", None, budgets)
    assert "100.0 GPU-hours, 20.0 spent as Slurm counts it (all users, decayed), 80.0 left" in page
    assert "budget teama" not in page  # the report is teamb's
    image = pixels(plot_images(page)["cumulative GPU-hours per account"])
    plain = pixels(plot_images(reports["html"]["teamb"])["cumulative GPU-hours per account"])
    orange = (0xFF, 0x7F, 0x0E)  # the second line: the budget, beside teamb's curve (dashed: blended edges)
    assert colour_mask(image, orange, 60).sum() > 300 and colour_mask(plain, orange, 60).sum() == 0


def test_secret_values_never_reach_a_report(reports):
    for name, html in reports["html"].items():
        assert SECRET not in html, name
    for name in ("job", "array"):
        assert "<td>API_KEY</td><td>&lt;secret&gt;</td>" in reports["html"][name]
        assert "<td>MODE</td><td>visible-value</td>" in reports["html"][name]


def test_unknown_job_sweep_or_account_is_a_clear_error(reports):
    with Ledger(reports["ledger"]) as ledger:
        for call, match in ((lambda: job_report(ledger, reports["site"], 999), "job 999: no such ledger id"),
                            (lambda: sweep_report(ledger, reports["site"], "nope"), "sweep 'nope': not in the ledger"),
                            (lambda: account_report(ledger, reports["site"], "nobody", None), "account 'nobody'")):
            with pytest.raises(HpctrainError, match=match):
                call()


def test_cli_writes_the_report_and_loads_no_plotting_library_for_help(reports, tmp_path):
    env = {"HPCTRAIN_LEDGER": str(reports["ledger"])}
    out = run_cli("report", "--site", "dev", "--account", "--since", "2000-01-01", "--out", str(tmp_path / "a.html"),
                  env=env)
    assert out.returncode == 0 and out.stdout == f"wrote {tmp_path / 'a.html'}\n", out.stderr
    assert "cumulative GPU-hours per account" in (tmp_path / "a.html").read_text()
    job, array = reports["ids"]
    losses = [_loss(step, -1) for step in range(1, 51)]
    out = run_cli("report", "--site", "dev", str(job), "--out", str(tmp_path / "j.html"), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (f"wrote {tmp_path / 'j.html'}\n  loss: {losses[0]:.4g} at step 1 → {losses[-1]:.4g} at step 50 "
                          f"(smoothed {smoothed(losses)[-1]:.4g})\n")
    out = run_cli("report", "--site", "dev", str(array), "--out", str(tmp_path / "r.html"), env=env)
    assert out.stdout.splitlines()[1:] == [f"  loss (task {t}): {_loss(1, t):.4g} at step 1 → {_loss(50, t):.4g} at step 50 "
                                           f"(smoothed {smoothed([_loss(s, t) for s in range(1, 51)])[-1]:.4g})"
                                           for t in range(3)]
    out = run_cli("report", "--site", "dev", "999", env=env)
    assert out.returncode == 2
    assert out.stderr == "hpctrain: error: job '999': no such ledger id (see `hpctrain status --all`)\n"
    code = ("import sys\nfrom click.testing import CliRunner\nfrom hpctrain.cli import cli\n"
            "r = CliRunner().invoke(cli, ['report', '--help'])\nassert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in ('matplotlib', 'numpy', 'torch', 'jinja2') if m in sys.modules))\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/install installs it)")


@needs_chromium
@pytest.mark.parametrize("name, plots", [("job", len(JOB_PLOTS)), ("accounts", 2)])
def test_chromium_renders_the_plots(reports, tmp_path, name, plots):
    shot = screenshot(reports["files"][name], tmp_path / "shot.png")
    assert shot.std() > 0
    # The plots' own pixels: an image that failed to load would show no C0 at all.
    assert _colour_count(shot, C0) > 150 * plots


@needs_chromium
def test_chromium_shows_the_marks_where_attempts_began(reports, tmp_path):
    shot = screenshot(reports["files"]["job"], tmp_path / "shot.png")
    xs = mark_columns(shot)
    assert_marks_at(xs, MARK_STEPS)
    assert mark_steps(shot, 1, 50) == pytest.approx(MARK_STEPS, abs=0.25)
    assert page_marks(reports["files"]["job"]) == xs
    assert page_marks(reports["files"]["array"]) == []


@needs_chromium
def test_chromium_shows_the_page_text(reports):
    out = chromium("--dump-dom", reports["files"]["job"].as_uri())
    assert out.returncode == 0, out.stderr
    assert "<title>job 1: gpt-small</title>" in out.stdout and "<h1>job 1: gpt-small</h1>" in out.stdout
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png', out.stdout)) == len(JOB_PLOTS)


def test_job_report_lists_the_evaluations_of_its_checkpoints(reports):
    html = reports["html"]["job"]
    assert "evaluations of checkpoints" in html and "eval/loss 2.25" in html and "evaluator ppl: exited 3" in html
    assert "evaluations of checkpoints" not in reports["html"]["array"]
