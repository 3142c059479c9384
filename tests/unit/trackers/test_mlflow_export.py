"""`hpctrain export mlflow` against a real MLflow tracking server that the test starts (SQLite backend), read back
with MlflowClient: a run per job's task with params, tags, status and every metric point; evaluation results; the
registry's versions and aliases; a second export sends nothing, a later one only what is new; an unreachable
server is one line and changes nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hpctrain.ledger import Ledger
from hpctrain.registry.aliases import decide, promote

from helpers.cli import run_cli
from helpers.trackers import T0, ledger_with_runs, metrics

mlflow = pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow


def start_server(tmp: Path) -> tuple[subprocess.Popen, str] | None:
    """`mlflow server` on a port found free and its URI, once it answers; None if another process took the port
    meanwhile (a busy machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}", "--workers", "1",
                             "--default-artifact-root", str(tmp / "artifacts")],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).read()
            return proc, uri
        except OSError:
            if proc.poll() is not None:
                assert "address already in use" in log.read_text().lower(), log.read_text()[-3000:]
                return None
            assert time.monotonic() < deadline, "mlflow server did not answer in 3 minutes"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a SQLite store, as a team would run it; its URI."""
    tmp = tmp_path_factory.mktemp("mlflow")
    for _ in range(3):
        if started := start_server(tmp):
            break
    else:
        pytest.fail("three ports found free were taken before mlflow server bound them")
    proc, uri = started
    yield uri
    proc.terminate()
    proc.wait(30)


def runs_by_name(client, experiment: str) -> dict:
    exp = client.get_experiment_by_name(experiment)
    return {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}


def history(client, run, key: str) -> list[tuple[int, float, int]]:
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run.info.run_id, key))


def test_runs_metrics_evaluations_and_registry_then_only_what_is_new(server, isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, array = ledger_with_runs(ledger, tmp_path)
    first = run_cli("export", "mlflow", "--tracking-uri", server, "--experiment", "team")
    assert first.returncode == 0, first.stderr
    assert first.stdout == (f"MLflow at {server}: 3 runs created, 0 updated, 240 metric values, 1 evaluations, 2 model "
                            "versions, aliases moved: gpt@production, gpt@staging\n"), first.stdout
    assert first.stderr == ""
    client = mlflow.MlflowClient(tracking_uri=server)
    runs = runs_by_name(client, "team")
    assert set(runs) == {"gpt-a", "gpt-b[0]", "gpt-b[1]"}
    a, b0, b1 = runs["gpt-a"], runs["gpt-b[0]"], runs["gpt-b[1]"]
    assert (a.info.status, b0.info.status, b1.info.status) == ("FINISHED", "FINISHED", "FAILED")
    assert a.data.params["hyperparameters.lr"] == "0.001" and a.data.params["code.commit"] == "abc123"
    assert b1.data.params["params.lr"] == "0.002" and b1.data.params["seed"] == "3"
    assert a.data.tags["mlflow.source.git.commit"] == "abc123" and a.data.tags["hpctrain.ledger_job_id"] == str(plain)
    assert b1.data.tags["hpctrain.slurm_job_id"] == "4242" and b1.data.tags["hpctrain.task_index"] == "1"
    assert history(client, a, "loss") == [(s, 3.0 / s, int((T0 + s) * 1000)) for s in range(1, 41)]
    assert [h[0] for h in history(client, b1, "lr")] == list(range(1, 21))
    assert [(s, v) for s, v, _ in history(client, a, "heldout/eval/loss")] == [(40, 2.5)]
    versions = {int(v.tags["hpctrain.version"]): v for v in client.search_model_versions("name = 'gpt'")}
    assert versions[1].run_id == a.info.run_id and versions[2].run_id == b0.info.run_id
    assert versions[1].tags["hpctrain.checkpoint"].endswith("step_00000040")
    aliases = client.get_registered_model("gpt").aliases
    assert aliases == {"production": versions[1].version, "staging": versions[2].version}

    again = run_cli("export", "mlflow", "--tracking-uri", server, "--experiment", "team")
    assert again.returncode == 0 and "0 runs created, 0 updated, 0 metric values, 0 evaluations, 0 model versions" \
        in again.stdout and "aliases moved" not in again.stdout, again.stdout
    assert len(history(client, a, "loss")) == 40

    with Ledger(isolated_ledger) as ledger:
        metrics(ledger, plain, -1, range(41, 51))
        promote(ledger, decide(ledger, "gpt", 2, "production"), why="a/b", force=True)
    later = run_cli("export", "mlflow", str(plain), "--tracking-uri", server, "--experiment", "team")
    assert later.returncode == 0 and "0 runs created, 1 updated, 30 metric values" in later.stdout, later.stdout
    assert "aliases moved: gpt@production" in later.stdout
    assert [h[0] for h in history(client, a, "loss")] == list(range(1, 51))
    assert client.get_registered_model("gpt").aliases["production"] == versions[2].version
    assert len(runs_by_name(client, "team")) == 3


def test_an_unreachable_server_is_one_line_and_nothing_is_recorded(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        ledger_with_runs(ledger, tmp_path)
    with socket.socket() as held:  # bound, never listening: refused, and no other process can take the port
        held.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{held.getsockname()[1]}"
        out = run_cli("export", "mlflow", "--tracking-uri", uri)
    assert out.returncode == 2 and out.stderr.startswith(f"hpctrain: error: MLflow tracking server {uri}: unreachable")
    assert out.stderr.count("\n") == 1 and "nothing was exported" in out.stderr
    with Ledger(isolated_ledger) as ledger:
        assert ledger.exports.get(f"mlflow:{uri}", 1, -1) is None


@pytest.mark.parametrize("args, message", [
    (["77"], "job 77: no such ledger id (see `hpctrain status --all`)"),
    (["--since", "yesterday"], "--since: expected a date such as 2026-11-01, got 'yesterday'"),
    (["--sweep", "nope"], "sweep 'nope': no such sweep in the ledger"),
    (["1", "--sweep", "s"], "give JOB ids, --sweep or --since, not more than one"),
])
def test_bad_selections_are_one_line(isolated_ledger, tmp_path, args, message):
    with Ledger(isolated_ledger) as ledger:
        ledger_with_runs(ledger, tmp_path)
    out = run_cli("export", "mlflow", *args, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}")
    assert out.returncode == 2 and out.stderr == f"hpctrain: error: {message}\n"
    assert not (tmp_path / "m.db").exists()
