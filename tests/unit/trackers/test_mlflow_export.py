"""`hpctrain export mlflow` against a real MLflow tracking server that the test starts (SQLite backend), read back
with MlflowClient: a run per job's task with params, tags, status and every metric point; evaluation results; the
registry's versions and aliases; a second export sends nothing, a later one only what is new; an unreachable
server is one line and changes nothing. Killed at every write and run again, or run twice at once, it leaves what
one clean run leaves; values that arrive late or change are sent; names MLflow refuses are mapped; aliases set in
MLflow itself stay; credentials in the URI are never printed or kept."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.ledger import Ledger
from hpctrain.registry.aliases import decide, promote

from helpers.cli import HPCTRAIN, run_cli
from helpers.trackers import T0, assert_one_clean_copy, ledger_with_runs, metrics

mlflow = pytest.importorskip("mlflow")
# One worker runs them all (scripts/test's --dist loadgroup): one `mlflow server` start (30-180 s and more under CI load)
# instead of one a worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("mlflow")]


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
                            # no job runner: its 8 huey consumers poll for jobs (a core's worth of CPU on this machine)
                            # that an export never makes
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    uri = f"http://127.0.0.1:{port}"
    # About 15 CPU-seconds. Under CI every test process shares one scheduling group (the kernel's autogroup: one a
    # session) while each Slurm job has a group of its own: with a dozen jobs running, it took 133 s, once over 180.
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).read()
            return proc, uri
        except OSError:
            if proc.poll() is not None:
                assert "address already in use" in log.read_text().lower(), log.read_text()[-3000:]
                return None
            if time.monotonic() > deadline:
                proc.terminate()  # not left running once the tests fail
                proc.wait(30)
                pytest.fail("mlflow server did not answer in 10 minutes")
            time.sleep(0.5)


@pytest.fixture(scope="session")  # once a worker, whatever order the tests run in
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
    (["--since", ""], "--since: expected a date such as 2026-11-01, got ''"),
    (["--sweep", ""], "sweep '': no such sweep in the ledger"),
])
def test_bad_selections_are_one_line(isolated_ledger, tmp_path, args, message):
    with Ledger(isolated_ledger) as ledger:
        ledger_with_runs(ledger, tmp_path)
    out = run_cli("export", "mlflow", *args, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}")
    assert out.returncode == 2 and out.stderr == f"hpctrain: error: {message}\n"
    assert not (tmp_path / "m.db").exists()


WRITES = ("create_experiment", "create_run", "log_batch", "set_tag", "set_terminated", "update_run", "delete_run",
          "create_registered_model", "create_model_version", "set_registered_model_alias",
          "delete_registered_model_alias", "set_registered_model_tag")
# `hpctrain export mlflow ARGS` that kills itself (SIGKILL) right after its Nth log_batch call returns.
KILL_AFTER_BATCHES = """
import os, signal, sys
from mlflow import MlflowClient
n, done, log_batch = int(sys.argv[1]), [], MlflowClient.log_batch
def counted(self, *a, **k):
    log_batch(self, *a, **k)
    done.append(1)
    if len(done) == n:
        os.kill(os.getpid(), signal.SIGKILL)
MlflowClient.log_batch = counted
from hpctrain.cli import main
sys.argv = ["hpctrain", *sys.argv[2:]]
main()
"""


class Killed(BaseException):
    """What the test raises in place of SIGKILL: nothing of hpctrain's catches it."""


def test_killed_after_every_write_then_again_leaves_one_clean_copy(server, isolated_ledger, tmp_path, monkeypatch):
    """Each try is killed right after its first write to MLflow, until one runs through: every step boundary is
    crossed by a kill. Then: a run per job's task, none left RUNNING, every value once, one model version each."""
    with Ledger(isolated_ledger) as ledger:
        ledger_with_runs(ledger, tmp_path, model="killed")
    writes: list[str] = []

    def killed_after(name, call):
        def write(self, *args, **kwargs):
            call(self, *args, **kwargs)
            writes.append(name)
            raise Killed(name)
        return write

    for name in WRITES:
        monkeypatch.setattr(mlflow.MlflowClient, name, killed_after(name, getattr(mlflow.MlflowClient, name)))
    args = ["export", "mlflow", "--tracking-uri", server, "--experiment", "killed"]
    for _ in range(60):
        try:
            result = CliRunner().invoke(cli, args)
            break
        except Killed:
            pass
    else:
        pytest.fail(f"60 tries, each killed after a write, never ran through: {writes}")
    assert result.exit_code == 0, result.output
    assert {"create_run", "log_batch", "set_terminated", "create_model_version"} <= set(writes)
    monkeypatch.undo()
    client = mlflow.MlflowClient(tracking_uri=server)
    assert_one_clean_copy(client, "killed", isolated_ledger, runs=3)
    versions = [v.tags["hpctrain.version"] for v in client.search_model_versions("name = 'killed'")]
    assert sorted(versions) == ["1", "2"]
    assert set(client.get_registered_model("killed").aliases) == {"production", "staging"}


def test_kill_9_mid_export_then_two_at_once(server, isolated_ledger, tmp_path):
    """SIGKILL after the 1st, then the 3rd log_batch; then two exports at once (as from cron): one clean copy."""
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path, model="kill9")
        metrics(ledger, plain, -1, range(41, 400))  # more than one batch
    args = ["export", "mlflow", "--tracking-uri", server, "--experiment", "kill9"]
    for n in (1, 3):
        killed = subprocess.run([sys.executable, "-c", KILL_AFTER_BATCHES, str(n), *args], capture_output=True,
                                text=True, timeout=300)
        assert killed.returncode == -9, killed.stderr[-3000:]
    both = [subprocess.Popen([*HPCTRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for proc in both:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    client = mlflow.MlflowClient(tracking_uri=server)
    assert_one_clean_copy(client, "kill9", isolated_ledger, runs=3)
    assert sorted(v.tags["hpctrain.version"] for v in client.search_model_versions("name = 'kill9'")) == ["1", "2"]


def test_values_that_arrive_late_or_change_are_sent(server, isolated_ledger, tmp_path):
    """An evaluation ingested after a later one was exported (its node's clock behind), and a recomputed step's new
    value, reach MLflow on the next export."""
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path, model="late")
    args = ["export", "mlflow", str(plain), "--tracking-uri", server, "--experiment", "late"]
    assert run_cli(*args).returncode == 0
    with Ledger(isolated_ledger) as ledger:
        ledger.evaluations.done(plain, -1, 20, "heldout", {"eval/loss": 2.9}, T0)  # done before the one sent
        metrics(ledger, plain, -1, range(30, 31), base=60.0)  # step 30 recomputed: loss 2.0
    again = run_cli(*args)
    assert again.returncode == 0 and "1 updated, 1 metric values, 1 evaluations" in again.stdout, again.stdout
    client = mlflow.MlflowClient(tracking_uri=server)
    a = runs_by_name(client, "late")["gpt-a"]
    assert [(s, v) for s, v, _ in history(client, a, "heldout/eval/loss")] == [(20, 2.9), (40, 2.5)]
    assert [v for s, v, _ in history(client, a, "loss") if s == 30] == [0.1, 2.0]
    assert run_cli(*args).stdout.count(" 0 metric values, 0 evaluations") == 1


def test_aliases_set_in_mlflow_stay_and_credentials_are_never_shown_or_kept(server, isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path, model="own")
    secret_uri = server.replace("http://", "http://someone:s3cr%2Ft@")
    first = run_cli("export", "mlflow", "--tracking-uri", secret_uri, "--experiment", "own")
    assert first.returncode == 0 and f"MLflow at {server}: 3 runs created" in first.stdout, first.stderr
    client = mlflow.MlflowClient(tracking_uri=server)
    client.set_registered_model_alias("own", "canary", "1")  # set by a person, in MLflow
    with Ledger(isolated_ledger) as ledger:
        promote(ledger, decide(ledger, "own", 2, "production"), why="a/b", force=True)
    later = run_cli("export", "mlflow", "--tracking-uri", secret_uri, "--experiment", "own")
    assert later.returncode == 0 and "aliases moved: own@production" in later.stdout
    assert client.get_registered_model("own").aliases == {"canary": "1", "production": "2", "staging": "2"}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        down = run_cli("export", "mlflow", "--tracking-uri", f"http://someone:s3cr%2Ft@127.0.0.1:{held.getsockname()[1]}")
    assert down.returncode == 2 and "unreachable" in down.stderr
    keys = [r[0] for r in sqlite3.connect(isolated_ledger).execute("SELECT DISTINCT tracker FROM tracker_exports")]
    assert keys == [f"mlflow:{server}"]
    for out in (first, later, down):
        assert "s3cr" not in out.stdout + out.stderr and "someone" not in out.stdout + out.stderr


BAD_NAMES = ["a<b", "it's", "wow!", "x[0]", "two\nlines", "nul\x00", "n" * 300, "../up", "/root", "a//b", ""]


def test_names_mlflow_refuses_are_mapped_and_block_no_other_job(server, isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, array = ledger_with_runs(ledger, tmp_path, model="names")
        ledger.metrics.record(plain, -1, 41, {name: float(i) for i, name in enumerate(BAD_NAMES)}, 0, T0 + 41)
        with ledger.transaction() as db:
            db.execute("UPDATE jobs SET lineage_json = json_set(lineage_json, '$.hyperparameters.\"b<d\"', 2) "
                       "WHERE id = ?", [plain])
    args = ["export", "mlflow", "--tracking-uri", server, "--experiment", "names"]
    first = run_cli(*args)
    assert first.returncode == 0 and "3 runs created" in first.stdout, first.stderr
    client = mlflow.MlflowClient(tracking_uri=server)
    runs = runs_by_name(client, "names")
    a = runs["gpt-a"]
    originals = {v: k.removeprefix("hpctrain.name.") for k, v in a.data.tags.items() if k.startswith("hpctrain.name.")}
    assert set(originals) == {*BAD_NAMES, "hyperparameters.b<d"}
    assert {name: a.data.metrics[key] for name, key in originals.items() if name in BAD_NAMES} == {
        name: float(i) for i, name in enumerate(BAD_NAMES)}
    assert a.data.params[originals["hyperparameters.b<d"]] == "2"
    assert [h[0] for h in history(client, runs["gpt-b[1]"], "loss")] == list(range(1, 21))
    assert "0 runs created, 0 updated, 0 metric values" in run_cli(*args).stdout


@pytest.mark.parametrize("uri, says", [
    ("", "--tracking-uri"), ("http://", "--tracking-uri"), ("http://host:port", "--tracking-uri"),
    ("http://[::1", "--tracking-uri"), ("no-scheme", "--tracking-uri"), ("http://a b", "--tracking-uri"),
    ("foo://bar", "MLflow at foo://bar: "), ("postgresql://me:s3cr@127.0.0.1:1/db", "MLflow at postgresql://127.0.0.1:1/db: "),
])
def test_malformed_tracking_uris_are_one_line(isolated_ledger, tmp_path, uri, says):
    with Ledger(isolated_ledger) as ledger:
        ledger_with_runs(ledger, tmp_path)
    out = run_cli("export", "mlflow", "--tracking-uri", uri)
    assert out.returncode == 2 and out.stderr.startswith(f"hpctrain: error: {says}"), out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "s3cr" not in out.stderr
