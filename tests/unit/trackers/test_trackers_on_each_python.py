"""The exports from the wheel with its [mlflow,tensorboard] extras on each login-node Python (3.10, 3.12, 3.13; the
suite's own 3.11 runs the other tests here): every run, point, version and alias reaches MLflow's SQLite store and
TensorBoard's event files, read back by that Python's own MLflow and TensorBoard."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpctrain.ledger import Ledger

from helpers.trackers import ledger_with_runs
from helpers.wheels import LOGIN_PYTHONS, hpctrain, interpreter, venv_with

pytestmark = pytest.mark.slow
READ_BACK = """
import json, sys
from mlflow import MlflowClient
from tensorboard.backend.event_processing import event_accumulator as ea
client = MlflowClient(tracking_uri=sys.argv[1])
runs = client.search_runs([client.get_experiment_by_name("hpctrain").experiment_id])
points = sum(len(client.get_metric_history(r.info.run_id, k)) for r in runs for k in r.data.metrics)
acc = ea.EventAccumulator(sys.argv[2], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(json.dumps({"runs": sorted(r.info.run_name for r in runs), "points": points,
                  "aliases": sorted(client.get_registered_model("gpt").aliases),
                  "scalars": sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"])}))
"""


@pytest.fixture(scope="module", params=LOGIN_PYTHONS)
def tracker_install(request, wheel, tmp_path_factory):
    """The wheel with the extras [mlflow,tensorboard], in a venv of each Python: its bin directory."""
    python = interpreter(request.param)
    if python is None:
        pytest.skip(f"no Python {request.param} on this machine")
    return venv_with(python, tmp_path_factory.mktemp(f"trackers{request.param}"), f"{wheel}[mlflow,tensorboard]")


def test_both_exports_reach_the_stores(tracker_install, isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path)
    uri, tb = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "tb"
    sent = hpctrain(tracker_install, "export", "mlflow", "--tracking-uri", uri, cwd=tmp_path, timeout=300)
    assert sent.returncode == 0 and "3 runs created" in sent.stdout, sent.stderr[-2000:]
    written = hpctrain(tracker_install, "export", "tensorboard", str(tb / "a"), str(plain), cwd=tmp_path)
    assert written.returncode == 0, written.stderr[-2000:]
    read = subprocess.run([tracker_install / "python", "-c", READ_BACK, uri, str(tb / "a" / f"{plain}-gpt-a")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert read.returncode == 0, read.stderr[-2000:]
    assert json.loads(read.stdout.splitlines()[-1]) == {
        "runs": ["gpt-a", "gpt-b[0]", "gpt-b[1]"], "points": 241, "aliases": ["production", "staging"], "scalars": 121}
