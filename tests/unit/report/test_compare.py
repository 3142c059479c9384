"""`hpctrain compare`: runs side by side from the ledger (what differs, final and best metrics, GPU-hours, attempts),
as a table, as JSON and as a page whose overlaid curves a headless Chromium shows."""

from __future__ import annotations

import json
import time

import pytest

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.report.compare import compare_runs, parse_metrics, runs_of_jobs, runs_of_sweep
from hpctrain.report.compare_page import compare_page
from hpctrain.sweep import store
from hpctrain.sweep.spec import load_sweep_spec

from helpers.cli import run_cli
from helpers.report import CHROMIUM, colour_mask, plot_images, pixels, screenshot

T0 = time.time() - 86400
C0, C1 = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # matplotlib's first two line colours
LINEAGE = {"hyperparameters": {"lr": 3e-3, "warmup": 10}, "seed": 1234, "parallel": {"dp": 1, "tp": 2, "pp": 2},
           "code": {"commit": "abc123", "dirty": False}, "data": {"index": "/d/index.json", "sha256": "f00d"},
           "versions": {"hpctrain": "0.9", "torch": "2.13.0"}, "spec_sha256": "differs-anyway", "cwd": "/home/a"}
SWEEP = """
name = "lr-sweep"
method = "random"
metric = "eval/loss"
direction = "minimize"
max_trials = 3
[search]
lr = { type = "loguniform", low = 1e-4, high = 1e-1 }
[job]
name = "trial"
command = ["python", "train.py"]
"""


def _job(ledger: Ledger, name: str, lineage: dict, **fields: object) -> int:
    return Table(ledger, "jobs").insert({"name": name, "site": "dev", "user": "alice", "account": "teama",
                                         "state": "COMPLETED", "submitted_at": T0, "lineage_json": json.dumps(lineage),
                                         **fields})


def _run(ledger: Ledger, job: int, task: int, causes: tuple[str, ...], scale: float, steps: int = 100) -> None:
    """Attempts of an hour each on 4 GPUs, and a loss by step (every step) and held-out loss (every 25)."""
    for attempt, cause in enumerate(causes):
        ledger.attempts.record(job, task, attempt, state="COMPLETED" if cause == "completed" else "PREEMPTED",
                               cause=cause, started_at=T0 + attempt * 3600, ended_at=T0 + (attempt + 1) * 3600,
                               alloc_gpus=4, elapsed_s=3600)
    span = len(causes) * 3600 / steps
    for s in range(1, steps + 1):
        values = {"loss": scale * (5 - 3 * s / steps)} | ({"eval/loss": scale * (5.2 - 3 * s / steps) + (s == steps)}
                                                         if s % 25 == 0 else {})
        ledger.metrics.record(job, task, s, values, 0, T0 + s * span)


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory):
    """Two jobs that differ only in the learning rate (the first preempted once), and a sweep of three trials."""
    tmp = tmp_path_factory.mktemp("compare")
    with Ledger(tmp / "ledger.db") as ledger:
        fast = _job(ledger, "gpt", LINEAGE)
        _run(ledger, fast, -1, ("preemption", "completed"), 1.0)
        policy = {"below_percent": 5, "after_s": 60, "alert_s": 600}
        for attempt, util in enumerate((80.0, 40.0)):  # its GPUs as the node's sampler read them, each run an hour
            key = {"job_id": fast, "task_index": -1, "attempt": attempt, "step_restart": 0}
            ledger.gpus.record(key, "n1", "nvml", {str(d): {"samples": 720, "seconds": 3600.0, "mean": util,
                                                          "idle_s": 0.0, "idle_now_s": 0.0} for d in range(4)},
                               policy, [], T0 + (attempt + 1) * 3600, True)
        for step, read in ((50, 2e8), (100, 3.4e8)):  # its loader's reads from the shards' source, through a cache
            ledger.metrics.record(fast, -1, step, {"cache_source_bytes": read}, 0, T0 + step)
        slow = _job(ledger, "gpt", {**LINEAGE, "hyperparameters": {"lr": 1e-3, "warmup": 10}, "spec_sha256": "x"})
        _run(ledger, slow, -1, ("completed",), 1.1)
        path = tmp / "sweep.toml"
        path.write_text(SWEEP)
        swp, _ = store.register(ledger, load_sweep_spec(path), path)
        trials = _job(ledger, "trial", LINEAGE, is_array=1, sweep_id=swp.id)
        for n, lr in enumerate((1e-4, 1e-3, 1e-2)):
            Table(ledger, "array_tasks").insert({"job_id": trials, "task_index": n, "param_index": n,
                                                 "params_json": json.dumps({"lr": lr}), "state": "COMPLETED"})
            Table(ledger, "trials").insert({"sweep_id": swp.id, "number": n, "params_json": {"lr": lr},
                                            "state": "completed", "job_id": trials, "task_index": n})
            _run(ledger, trials, n, ("completed",), 1 + n / 10, steps=50)
    return tmp / "ledger.db"


def _compare(ledger_path, refs_of, metrics=("loss", "eval/loss")):
    with Ledger(ledger_path) as ledger:
        return compare_runs(ledger, refs_of(ledger), parse_metrics(metrics))


def test_two_runs_that_differ_in_learning_rate(ledger_path):
    got = _compare(ledger_path, lambda ledger: runs_of_jobs(ledger, [1, 2]))
    assert got.differing == ["hyperparameters.lr"]  # not the spec's hash, not the working directory
    assert got.same["code.commit"] == "abc123" and got.same["seed"] == 1234 and got.same["parallel.tp"] == 2
    first, second = got.runs
    assert (first.label, first.attempts, first.preemptions, first.steps) == ("1", 2, 1, 100)
    assert (second.attempts, second.preemptions) == (1, 0)
    assert first.gpu_util == pytest.approx(60.0) and second.gpu_util is None  # the second was not sampled
    assert first.gpu_hours == pytest.approx(8.0) and second.gpu_hours == pytest.approx(4.0)
    assert first.results["loss"]["last"] == pytest.approx(2.0) and first.results["loss"]["last_step"] == 100
    # The held-out loss is best at step 75: step 100's is worse (the runs overfit there).
    assert (first.results["eval/loss"]["best_step"], first.results["eval/loss"]["best"]) == (75, pytest.approx(2.95))
    assert first.results["eval/loss"]["last"] == pytest.approx(3.2) and first.results["eval/loss"]["points"] == 4


def test_a_higher_is_better_metric_takes_its_highest_value(ledger_path):
    got = _compare(ledger_path, lambda ledger: runs_of_jobs(ledger, [1]), ("eval/loss:max",))
    assert got.runs[0].results["eval/loss"]["best"] == pytest.approx(4.45)  # at step 25
    assert got.to_json()["metrics"] == {"eval/loss": "max"}


def test_a_sweeps_trials_with_their_parameters_and_the_sweeps_metric(ledger_path):
    def refs(ledger):
        found, metric = runs_of_sweep(ledger, "lr-sweep")
        assert metric == {"eval/loss": True}
        return found

    got = _compare(ledger_path, refs)
    assert [r.label for r in got.runs] == ["trial 0", "trial 1", "trial 2"]
    assert got.differing == ["params.lr"]
    assert [r.results["eval/loss"]["best"] for r in got.runs] == pytest.approx([3.2, 3.42, 3.64])


def test_json_table_and_errors_on_the_command_line(ledger_path, tmp_path):
    env = {"HPCTRAIN_LEDGER": str(ledger_path)}
    out = run_cli("compare", "1", "2", "--json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["differing"] == ["hyperparameters.lr"] and [r["job_id"] for r in data["runs"]] == [1, 2]
    assert data["runs"][0]["results"]["eval/loss"]["best_step"] == 75
    table = run_cli("compare", "1", "2", env=env)
    assert table.returncode == 0 and "hyperparameters.lr" in table.stdout and "2.95 @ 75" in table.stdout
    assert "same in every run: code.commit=abc123" in table.stdout
    assert data["runs"][0]["gpu_util"] == pytest.approx(60.0) and "GPU util" in table.stdout and "60%" in table.stdout
    assert [r["source_bytes"] for r in data["runs"]] == [3.4e8, None] and "source MB" in table.stdout
    for args, error in ((["99"], "hpctrain: error: job 99: no such ledger id (see `hpctrain status --all`)\n"),
                        (["--sweep", "nope"], "hpctrain: error: sweep 'nope': not in the ledger "
                                              "(see `hpctrain sweep status`)\n"),
                        (["1", "--metric", ":max"], "hpctrain: error: --metric ':max': expected NAME, NAME@min or "
                                                    "NAME@max\n")):
        bad = run_cli("compare", *args, env=env)
        assert (bad.returncode, bad.stderr) == (2, error)
    usage = run_cli("compare", env=env)
    assert usage.returncode == 2 and "give JOB ids or --sweep SWEEP" in usage.stderr


def test_the_page_overlays_every_runs_curves_by_step_and_by_gpu_hour(ledger_path, tmp_path):
    with Ledger(ledger_path) as ledger:
        got = compare_runs(ledger, runs_of_jobs(ledger, [1, 2]), parse_metrics(["loss", "eval/loss"]))
        html = compare_page(ledger, got)
    images = plot_images(html)
    assert set(images) == {"loss vs step", "loss vs GPU-hours", "eval/loss vs step", "eval/loss vs GPU-hours"}
    for png in images.values():  # both runs drawn in each
        image = pixels(png)
        assert colour_mask(image, C0).sum() > 100 and colour_mask(image, C1).sum() > 100
    if CHROMIUM is None:
        pytest.skip("chromium not installed (scripts/install installs it)")
    page = tmp_path / "compare.html"
    page.write_text(html)
    shot = screenshot(page, tmp_path / "shot.png")
    assert colour_mask(shot, C0).sum() > 300 and colour_mask(shot, C1).sum() > 300


def test_no_runs_is_one_line(ledger_path):
    with Ledger(ledger_path) as ledger, pytest.raises(HpctrainError, match="no runs to compare"):
        compare_runs(ledger, [], {})


def test_evaluation_results_compare_as_evaluator_metric(tmp_path):
    """`--metric heldout:loss` reads the evaluation jobs' results (one value per evaluated checkpoint), '@max' the
    highest; the older ':max' still works where it cannot name an evaluator's metric, and is refused where it can."""
    with Ledger(tmp_path / "ledger.db") as ledger:
        job = _job(ledger, "gpt", LINEAGE)
        _run(ledger, job, -1, ("completed",), 1.0)
        for step, loss, top1 in ((25, 2.5, 0.4), (50, 2.25, 0.5), (75, 2.75, 0.45)):
            ledger.evaluations.done(job, -1, step, "heldout", {"loss": loss, "acc@1": top1}, T0)
    env = {"HPCTRAIN_LEDGER": str(tmp_path / "ledger.db")}
    out = run_cli("compare", str(job), "--metric", "heldout:loss", "--metric", "heldout:acc@1@max",
                  "--metric", "loss:max", "--json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["metrics"] == {"heldout:loss": "min", "heldout:acc@1": "max", "loss": "max"}
    results = data["runs"][0]["results"]
    assert results["heldout:loss"] == {"last_step": 75, "last": 2.75, "best_step": 50, "best": 2.25, "points": 3}
    assert results["heldout:acc@1"]["best"] == 0.5 and results["loss"]["best_step"] == 1
    page = tmp_path / "page.html"
    table = run_cli("compare", str(job), "--metric", "heldout:loss", "--html", str(page), env=env)
    assert "2.75 @ 75" in table.stdout and "2.25 @ 50" in table.stdout
    assert "heldout:loss vs step" in plot_images(page.read_text())  # drawn as the held-out points they are
    ambiguous = run_cli("compare", str(job), "--metric", "heldout:max", env=env)
    assert ambiguous.returncode == 2 and ambiguous.stderr.startswith(
        "hpctrain: error: --metric 'heldout:max' is ambiguous: write heldout@max") and ambiguous.stderr.count("\n") == 1
