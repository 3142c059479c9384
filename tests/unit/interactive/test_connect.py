"""The login side of a session and its token: the token stays in files readable by the user alone. `notebook --open`
gives the browser a page of that kind, never the token on its command line (every user of the host can read it);
`status` and `status --json` print the URL without it and the file that holds it. No Slurm: the session's file is
written here as the compute node writes it."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.interactive import Session, Started
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.cli import run_cli

TOKEN = "tok-" + "x" * 40


def session_dir(tmp_path: Path) -> Path:
    """A job directory whose session file says JupyterLab listens on a local port where nothing answers."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "session.json").write_text(json.dumps(
        {"node": "n1", "address": "127.0.0.1", "port": 1, "token": TOKEN, "idle_minutes": 60}))
    (job_dir / "session.json").chmod(0o600)
    return job_dir


def test_open_gives_the_browser_a_private_page_and_not_the_token(tmp_path, monkeypatch):
    job_dir = session_dir(tmp_path)
    session = Session.read(job_dir)
    placement = SimpleNamespace(partition="gpu", qos="normal", account="teama")
    monkeypatch.setattr("hpctrain.cli.interactive.open_site", lambda site: (None, contextlib.nullcontext(), None))
    monkeypatch.setattr("hpctrain.interactive.start", lambda *args: Started(7, "41", placement, session))
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    result = CliRunner().invoke(cli, ["notebook", "--open"], prog_name="hpctrain")
    assert result.exit_code == 0, result.output
    assert len(opened) == 1 and TOKEN not in opened[0]
    page = Path(urllib.parse.urlparse(opened[0]).path)
    assert page.parent == job_dir and page.stat().st_mode & 0o777 == 0o600
    assert f'content="0;url=http://127.0.0.1:1/lab?token={TOKEN}"' in page.read_text()


def test_status_prints_the_token_file_and_not_the_token(isolated_ledger, tmp_path):
    job_dir = session_dir(tmp_path)
    with Ledger(isolated_ledger) as ledger:
        job = Table(ledger, "jobs").insert({
            "name": "lab", "site": "dev", "state": "RUNNING", "slurm_job_id": "41", "job_dir": str(job_dir),
            "spec_json": json.dumps({"name": "lab", "interactive": {"idle_minutes": 60}})})
    listed = run_cli("status", "--no-refresh", "--json")
    assert listed.returncode == 0, listed.stderr
    assert TOKEN not in listed.stdout
    assert json.loads(listed.stdout)[0]["session"] == {
        "url": "http://127.0.0.1:1/lab", "token_file": str(job_dir / "session.json"), "idle_s": None,
        "idle_minutes": 60}
    shown = run_cli("status", "--no-refresh")
    assert shown.returncode == 0, shown.stderr
    assert TOKEN not in shown.stdout
    assert (f"  job {job} session: http://127.0.0.1:1/lab (token in {job_dir / 'session.json'}; not answering; "
            "ends after 60)") in shown.stdout


@pytest.mark.parametrize("host", [None, "localhost"])
def test_a_url_is_given_without_its_token_when_asked(host):
    session = Session("n1", "10.0.0.5", 8888, TOKEN, 60)
    assert session.url(host, token=False) == f"http://{host or '10.0.0.5'}:8888/lab"
    assert session.url(host) == f"http://{host or '10.0.0.5'}:8888/lab?token={TOKEN}"
