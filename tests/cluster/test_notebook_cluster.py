"""`hpctrain notebook` on the dev cluster, as a user runs it: JupyterLab reached from the login side with the
session's token (a kernel imports torch and reads the job spec's data path), the lab's shell in headless Chromium,
`status` showing the session, and Jupyter's culling ending the idle session: its GPUs free, its time in the ledger
under its own cause. Bad input says what to change in one line and leaves no job running."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.interactive import Session
from hpctrain.ledger import Ledger
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter

from helpers.cli import HPCTRAIN, run_cli
from helpers.cluster import HIGH
from helpers.jupyter import api, listening, run_cell
from helpers.report import chromium, colour_mask, pixels
from helpers.waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason=(
        "host's Slurm only (CI time, about 4 min; the lanes' trees have no Chromium): a session is a one-task srun "
        "job like any other, which every lane runs; the shell test passed on the 26.05 lane (squeue -s alike)")),
]
IDLE_MINUTES = 1
LAB_PANEL, LAB_BLUE = (238, 238, 238), (25, 118, 210)  # JupyterLab's light theme: side panels, the launcher's blue


def started(*args: str) -> tuple[int, str]:
    """`hpctrain notebook ARGS`: the session's ledger id and what it printed."""
    done = run_cli("notebook", *args, "--timeout", "400", timeout=500)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return int(re.search(r"ledger id (\d+)", done.stdout)[1]), done.stdout


def test_a_session_is_reached_used_shown_and_ends_when_idle(isolated_ledger, tmp_path):
    index = tmp_path / "index.json"
    index.write_text('{"shards": ["train-000.tar"]}')
    spec = tmp_path / "train.toml"
    spec.write_text(f'name = "gpt"\ncommand = ["python", "-m", "hpctrain.train"]\n[data]\nindex = "{index}"\n'
                    '[env]\nEXPERIMENT = "lab-1"\n[resources]\ngpus_per_node = 1\nmem = "2G"\ntime = "00:20:00"\n')
    job_id, printed = started("--spec", str(spec), "--idle-minutes", str(IDLE_MINUTES))
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.get(job_id)
    session = Session.read(job["job_dir"])
    assert f"ssh -N -L {session.port}:{session.address}:{session.port} " in printed
    assert f"http://localhost:{session.port}/lab?token={session.token}" in printed

    # The kernel runs in the job: the spec's environment, its data, torch.
    kernel = api(session, "kernels", "POST", {"name": "python3"})
    assert [k["id"] for k in api(session, "kernels")] == [kernel["id"]]
    import torch

    code = ("import json, os, torch\nspec = json.load(open(os.environ['HPCTRAIN_SPEC']))\n"
            "print(torch.__version__, os.environ['EXPERIMENT'], os.environ['SLURM_JOB_ID'])\n"
            "print(open(spec['data']['index']).read())")
    assert run_cell(session, kernel["id"], code).splitlines() == [
        f"{torch.__version__} lab-1 {job['slurm_job_id']}", index.read_text()]

    # `status` lists it with where it listens and its idle time.
    listed = {r["id"]: r for r in json.loads(run_cli("status", "--json").stdout)}
    assert listed[job_id]["state"] == "RUNNING"
    assert listed[job_id]["session"]["url"] == session.url(token=False) and listed[job_id]["session"]["idle_s"] >= 0
    assert listed[job_id]["session"]["token_file"] == str(session.file) and session.token not in run_cli(
        "status", "--json").stdout + run_cli("status").stdout

    # The lab's page, as a browser on the login side shows it: its shell, panels and launcher drawn.
    shot = tmp_path / "lab.png"
    chromium("--virtual-time-budget=30000", "--window-size=1200,800", f"--screenshot={shot}", session.url(),
             timeout=300)  # the lab's scripts take minutes to load on a busy 2-core machine
    image = pixels(shot.read_bytes())
    assert colour_mask(image, LAB_PANEL, 2).sum() > 20_000 and colour_mask(image, LAB_BLUE, 8).sum() > 500
    busy_until = time.time()

    # Nothing more happens: Jupyter culls the kernel and the server stops; the job ends and its GPU is free.
    stopped = wait_until(lambda: not listening(session) and time.time(), IDLE_MINUTES * 60 + 240, 1,
                         "the idle session's server to stop")
    assert stopped - busy_until <= IDLE_MINUTES * 60 + 60

    def ended():
        run_cli("status")
        with Ledger(isolated_ledger) as ledger:
            return ledger.jobs.get(job_id)["state"] in TERMINAL and ledger.jobs.get(job_id)
    assert wait_until(ended, 180, 3, "the session's job to end")["state"] == "COMPLETED"
    assert subprocess.run(["squeue", "-h", "-j", job["slurm_job_id"]], capture_output=True, text=True).stdout == ""
    assert run_cli("reconcile").returncode == 0
    cost = {r["job"]: r for r in json.loads(run_cli("cost", "--by", "job", "--json").stdout)}[job_id]
    assert cost["gpu_hours"] > 0
    assert cost["cause_gpu_hours"]["interactive"] == pytest.approx(cost["gpu_hours"])


def test_a_preempted_session_shows_the_notice_in_its_kernel_before_the_grace_ends(isolated_ledger):
    """QOS low's GraceTime is 20 s: the notice comes first (Slurm's --signal to the batch shell, passed on to the
    server, which passes it to its kernels), SIGTERM after the grace. The session is not requeued."""
    job_id, printed = started("--preemptible", "--gpus", "1", "--time", "00:20:00")
    assert "preemptible: it may be stopped at any time" in printed
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.get(job_id)
        assert job["qos"] == "low"
        session = Session.read(job["job_dir"])
        kernel = api(session, "kernels", "POST", {"name": "python3"})
        run_cell(session, kernel["id"], "import time")  # the kernel is up before the preemption

        def preempt() -> None:  # once the cell runs: a notice that comes between cells is printed under the last
            Submitter(load_site("dev"), ledger).submit(JobSpec.model_validate(HIGH), "<high>")

        # Shown while the kernel still runs: after the grace, SIGTERM stops the server and its kernels.
        shown = run_cell(session, kernel["id"], "for _ in range(600): time.sleep(0.1)", timeout_s=120,
                         until="save your work now", running=preempt)
        assert "this session got a stop notice" in shown
    wait_until(lambda: settled(isolated_ledger), 180, 2, "the preempted session to end")
    with Ledger(isolated_ledger) as ledger:
        assert ledger.jobs.get(job_id)["state"] in ("PREEMPTED", "CANCELLED")
        assert len(ledger.attempts.of_job(job_id)) == 1  # never requeued


def test_a_shell_session_runs_a_shell_in_the_allocation_and_ends_when_none_is_left(isolated_ledger):
    """`--shell` from a terminal: the command becomes a shell on the node (srun --overlap --pty), in the job; once
    it has exited and none other starts for the idle time, the allocation ends."""
    pid, tty = pty.fork()
    if pid == 0:  # the user's terminal
        os.execvpe(sys.executable, [*HPCTRAIN, "notebook", "--shell", "--gpus", "1", "--idle-minutes",
                                    str(IDLE_MINUTES), "--timeout", "400"], {**os.environ, "SHELL": "/bin/bash"})
    os.write(tty, b"echo IN-JOB=$SLURM_JOB_ID GPUS=$CUDA_VISIBLE_DEVICES; exit\n")
    seen = b""
    deadline = time.monotonic() + 500
    while time.monotonic() < deadline:
        try:
            chunk = os.read(tty, 4096) if select.select([tty], [], [], 5)[0] else b""
        except OSError:  # the terminal's other end closed: the shell and the command are done
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    shown = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, shown
    slurm_id = re.search(r"slurm job (\d+)", shown)[1]
    assert f"srun --jobid {slurm_id} --overlap --pty -- /bin/bash -l" in shown
    assert re.search(rf"IN-JOB={slurm_id} GPUS=\S+", shown), shown
    exited = time.time()

    def ended():
        run_cli("status")
        with Ledger(isolated_ledger) as ledger:
            (job,) = ledger.jobs.of_site("dev")
            return job["state"] in TERMINAL and job
    job = wait_until(ended, IDLE_MINUTES * 60 + 240, 3, "the held allocation to end")
    assert job["state"] == "COMPLETED" and job["ended_at"] - exited <= IDLE_MINUTES * 60 + 60


def test_a_port_in_use_on_the_node_is_one_line_and_no_job_is_left(isolated_ledger):
    with socket.socket() as taken:  # the dev cluster's nodes are this host
        taken.bind((socket.gethostbyname(socket.gethostname()), 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("notebook", "--port", str(port), "--timeout", "300", timeout=400)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert re.fullmatch(rf"hpctrain: error: port {port} is in use on \S+ \(.*\): give another --port, or none for a "
                        r"free one\n", done.stderr), done.stderr
    wait_until(lambda: settled(isolated_ledger), 120, 2, "the session's job to end")


def settled(ledger_path) -> bool:
    """Every job of the ledger has ended, after one `status` poll."""
    run_cli("status")
    with Ledger(ledger_path) as ledger:
        return all(job["state"] in TERMINAL for job in ledger.jobs.of_site("dev"))


@pytest.mark.parametrize(("args", "says"), [
    (["--partition", "nosuch"], "nosuch"),
    (["--partition", "debug", "--time", "3:00:00"], "time"),
])
def test_bad_resources_are_one_line_and_nothing_runs(args, says, isolated_ledger):
    done = run_cli("notebook", *args, "--timeout", "60")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr
    assert settled(isolated_ledger)
