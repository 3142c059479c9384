"""The compute-node side of a session, run here as a job step would run it: JupyterLab answers with the token it
wrote for the user alone, a kernel runs code, a stop notice shows in the kernel, and Jupyter's own culling ends the
server once it is idle. What cannot start says why in the session file and one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from hpctrain.interactive import Session, session_spec
from hpctrain.interactive.connect import SessionFailed

from helpers.jupyter import api, listening, run_cell
from helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
IDLE_MINUTES = 0.25


def serve(job_dir: Path, *python: str, **flags) -> subprocess.Popen:
    """`python -m hpctrain.interactive.serve` with a job's environment: its directory and spec."""
    job_dir.mkdir(exist_ok=True)
    (job_dir / "spec.json").write_text(session_spec(**flags).model_dump_json())
    env = {**os.environ, "HPCTRAIN_JOB_DIR": str(job_dir), "HPCTRAIN_SPEC": str(job_dir / "spec.json")}
    return subprocess.Popen([sys.executable, *(python or ("-m", "hpctrain.interactive.serve"))], cwd=job_dir,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_session_answers_runs_code_shows_a_notice_and_ends_when_idle(tmp_path):
    server = serve(tmp_path / "job", idle_minutes=IDLE_MINUTES)
    try:
        session = wait_until(lambda: Session.read(tmp_path / "job"), 120, 0.2, "the session file")
        assert (tmp_path / "job" / "session.json").stat().st_mode & 0o777 == 0o600
        assert session.token not in " ".join(Path(f"/proc/{server.pid}/cmdline").read_text().split("\0"))
        wait_until(lambda: session.idle_s() is not None, 60, 0.2, "the server to answer")
        with pytest.raises(urllib.error.HTTPError, match="403"):  # no token, no kernels
            api(Session(session.node, session.address, session.port, "wrong", 1), "kernels")
        kernel = api(session, "kernels", "POST", {"name": "python3"})
        assert run_cell(session, kernel["id"], "import os\nprint(os.environ['HPCTRAIN_JOB_DIR'])\n6 * 7") \
            == f"{tmp_path / 'job'}\n42\n"
        # A notice to the server (as the batch script passes Slurm's on) shows under the cell that is running.
        shown = run_cell(session, kernel["id"], f"import os, signal, time\nos.kill({server.pid}, signal.SIGUSR2)\n"
                         "time.sleep(2)", then_s=1)
        assert "this session got a stop notice" in shown and "save your work" in shown
        assert server.poll() is None  # the notice alone ends nothing
        busy_until = time.monotonic()
        # Jupyter culls the idle kernel, then the server stops listening (the process's exit after is not timed).
        stopped = wait_until(lambda: not listening(session) and time.monotonic(), IDLE_MINUTES * 60 + 120, 0.5,
                             "the idle server to stop")
        assert server.wait(timeout=120) == 0
    finally:
        server.kill()
    log = server.stdout.read()
    assert "Culling" in log and "shutting down" in log, log
    assert IDLE_MINUTES * 60 <= stopped - busy_until <= IDLE_MINUTES * 60 + 60, log


def test_a_port_in_use_is_one_line_and_the_reason_in_the_session_file(tmp_path):
    with socket.socket() as taken:
        taken.bind((socket.gethostbyname(socket.gethostname()), 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = serve(tmp_path / "job", port=port)
        out, _ = server.communicate(timeout=120)
    assert server.returncode == 2
    assert out.strip().splitlines()[-1].startswith(f"hpctrain notebook: port {port} is in use")
    assert "Traceback" not in out
    with pytest.raises(SessionFailed, match="give another --port, or none for a free one"):
        Session.read(tmp_path / "job")
    assert json.loads((tmp_path / "job" / "session.json").read_text()).keys() == {"error"}


def test_a_python_without_jupyterlab_says_what_to_install(tmp_path):
    """As in an image without it: the reason in the session file (the login side prints it) and one line."""
    without = ("-c", "import sys; sys.modules['jupyterlab'] = None\n"
               "from hpctrain.interactive.serve import main; sys.exit(main())")
    server = serve(tmp_path / "job", *without)
    out, _ = server.communicate(timeout=120)
    assert server.returncode == 2 and "Traceback" not in out
    assert out.strip().splitlines()[-1] == (
        f"hpctrain notebook: JupyterLab is not installed for {sys.executable} (jupyterlab is missing): "
        "pip install 'hpctrain[notebook]' there, or use an image that has it")
    with pytest.raises(SessionFailed, match=r"pip install 'hpctrain\[notebook\]'"):
        Session.read(tmp_path / "job")


def test_a_held_allocation_outlasts_a_controller_that_does_not_answer(tmp_path, monkeypatch):
    """A shell session ends once no shell ran for its idle time, never because squeue failed meanwhile."""
    from hpctrain.contract import JobEnvironment
    from hpctrain.errors import SlurmError
    from hpctrain.interactive import serve as served
    from hpctrain.slurm.client import SlurmClient

    answers_at, failed_at = time.monotonic() + 1.0, []

    def steps(self, job_id):
        if time.monotonic() < answers_at:
            failed_at.append(time.monotonic())
            raise SlurmError("squeue: error: Unable to contact slurm controller")
        return [f"{job_id}.0"]  # the session's own step only

    monkeypatch.setattr(SlurmClient, "steps", steps)
    monkeypatch.setattr(served, "CHECK_S", 0.05)
    env = JobEnvironment({"HPCTRAIN_JOB_DIR": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(served.NOTICE_SIGNAL)
    assert served.hold(env, session_spec(shell=True, idle_minutes=0.005).interactive) == 0
    assert failed_at and time.monotonic() >= failed_at[-1] + 0.3  # idle counted from the last check that failed
    assert Session.read(tmp_path).shell
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(served.NOTICE_SIGNAL)) == before
