"""Names in plots (metrics, a sweep's metric, parameters) are drawn as they are written: never parsed as matplotlib's
mathtext, so a name with '$' neither fails a page nor changes what it says."""

from __future__ import annotations

import json
import time

import pytest

from hpctrain.config import load_site
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.report import sweep_report
from hpctrain.report.compare import compare_runs, parse_metrics, runs_of_jobs
from hpctrain.report.compare_page import compare_page
from hpctrain.report.plots import lines
from hpctrain.sweep import store
from hpctrain.sweep.spec import load_sweep_spec

from helpers.bad_input import toml_key
from helpers.report import plot_images

pytest.importorskip("matplotlib")

NAMES = (r"$\frac{a}{$", "$x^2$")  # mathtext that does not parse, and mathtext that would be typeset


@pytest.fixture
def ledger_path(tmp_path):
    """A sweep of two completed trials whose metric is NAMES[0], both also reporting NAMES[1], and parameter NAMES[1]."""
    spec = tmp_path / "sweep.toml"
    spec.write_text(f'name = "s"\nmethod = "random"\nmetric = {toml_key(NAMES[0])}\ndirection = "minimize"\n'
                    f'max_trials = 2\n[search]\n{toml_key(NAMES[1])} = {{ type = "uniform", low = 0.1, high = 0.2 }}\n'
                    '[job]\nname = "trial"\ncommand = ["true"]\n')
    with Ledger(tmp_path / "ledger.db") as ledger:
        swp, _ = store.register(ledger, load_sweep_spec(spec), spec)
        job = Table(ledger, "jobs").insert({"name": "trial", "site": "dev", "state": "COMPLETED", "is_array": 1,
                                            "sweep_id": swp.id, "lineage_json": json.dumps({"seed": 1})})
        for n in (0, 1):
            params = {NAMES[1]: 0.1 + n / 20}
            Table(ledger, "array_tasks").insert({"job_id": job, "task_index": n, "param_index": n,
                                                 "params_json": json.dumps(params), "state": "COMPLETED"})
            Table(ledger, "trials").insert({"sweep_id": swp.id, "number": n, "params_json": params, "value": 1.0 + n,
                                            "state": "completed", "job_id": job, "task_index": n})
            for step in (1, 2, 3):
                ledger.metrics.record(job, n, step, {name: n + 1 / step for name in NAMES}, 0, time.time())
    return tmp_path / "ledger.db"


def test_a_sweep_report_with_mathtext_names_is_drawn(ledger_path):
    with Ledger(ledger_path) as ledger:
        html = sweep_report(ledger, load_site("dev"), "s")
    assert plot_images(html) and NAMES[0] in html


def test_a_comparison_page_with_mathtext_names_is_drawn(ledger_path):
    with Ledger(ledger_path) as ledger:
        got = compare_runs(ledger, runs_of_jobs(ledger, [1]), parse_metrics(NAMES))
        images = plot_images(compare_page(ledger, got))
    assert all(any(alt.startswith(name) for alt in images) for name in NAMES), list(images)


def test_a_name_is_drawn_as_written_not_typeset():
    """'$x^2$' drawn as text is wider than typeset as x squared: the plot's text is the name's characters."""
    import matplotlib.pyplot as plt

    from hpctrain.report.plots import figure

    fig, ax = figure()
    title = ax.set_title("$x^2$")
    assert title.get_parse_math() is False and title.get_usetex() is False
    plt.close(fig)
    assert lines({"$x^2$": ([1, 2], [1.0, 2.0])}, "$x^2$", "step", r"$\frac{a}{$").startswith(b"\x89PNG")
