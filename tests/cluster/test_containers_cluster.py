"""Jobs whose tasks run in an Apptainer image built here from a directory (no registry, no download): hpctrain's
launcher and task shim run inside it, the notice reaches a guarded loop there and the job requeues and resumes,
and `hpctrain logs` shows what the tasks printed. Apptainer is Debian sid's package: these run in the Slurm 26.05
lane (scripts/slurm-lane installs it there). pyxis cannot run here: tests/unit/submit/test_render.py has its golden scripts."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.config.site import Containers, SiteConfig
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.cluster import HIGH, finish
from helpers.paths import REPO
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(shutil.which("apptainer") is None,
                                 reason="no apptainer here (the Slurm 26.05 lane installs Debian sid's)")]


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A sandbox image: a directory with a root file system's layout, whose /usr is this machine's, bound read-only
    by the site (so its Python and its libraries are the ones the tests already run)."""
    root = tmp_path / "image"
    for d in ("usr", "etc", "tmp", "var/tmp", "root", "proc", "sys", "dev", "home"):
        (root / d).mkdir(parents=True)
    for d in ("bin", "lib", "lib64", "sbin"):
        (root / d).symlink_to(f"usr/{d}")
    for f in ("passwd", "group", "hosts"):
        shutil.copy(f"/etc/{f}", root / "etc" / f)
    return root


def apptainer_site() -> SiteConfig:
    site = load_site("dev")
    # The venv's interpreter lives under sys.base_prefix; --no-privs: root in this sandbox lacks a capability
    # (CAP_SYS_RESOURCE) Apptainer asks for by default.
    site.containers = Containers(runtime="apptainer", binds=["/usr:/usr:ro", str(REPO), sys.base_prefix],
                                 apptainer_options=["--no-privs"], python=sys.executable)
    return site


def test_two_tasks_run_in_the_image_under_hpctrain_launch(dev_cluster, isolated_ledger, image):
    probe = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'in', os.environ['APPTAINER_CONTAINER'])"
    spec = JobSpec.model_validate({"name": "in-apptainer", "command": [sys.executable, "-c", probe],
                                   "resources": {"tasks_per_node": 2, "mem": "1G", "time": "00:05:00", "account": "teama"},
                                   "container": {"image": str(image)}})
    with Ledger(isolated_ledger) as ledger:
        sub = Submitter(apptainer_site(), ledger).submit(spec, "<test>")
        assert finish(ledger, sub.ledger_ids[0], timeout=120) == "COMPLETED"
    logs = run_cli("logs", str(sub.ledger_ids[0]))
    assert logs.returncode == 0, logs.stderr
    assert f"0: rank 0 of 2 in {image}" in logs.stdout and f"1: rank 1 of 2 in {image}" in logs.stdout


def test_a_guarded_loop_in_the_image_is_preempted_and_resumes(dev_cluster, isolated_ledger, image, tmp_path):
    """The notice reaches the loop inside the container (signal, or the notice file in the mounted job directory);
    it saves, hpctrain requeues the job, and the next run, in the image again, finishes every step once."""
    state = tmp_path / "state"
    loop = REPO / "scripts" / "examples" / "guarded_loop.py"
    spec = JobSpec.model_validate({
        "name": "loop-in-apptainer", "command": [sys.executable, str(loop), str(state), "60"],
        "resources": {"gpus_per_node": 2, "tasks_per_node": 1, "mem": "1G", "time": "00:10:00", "account": "teama",
                      "preemptible": True},
        "container": {"image": str(image), "mounts": [str(tmp_path)]}})
    site = apptainer_site()
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.get(Submitter(site, ledger).submit(spec, "<test>").ledger_ids[0])
        journal = Journal(Path(job["job_dir"]) / "journal")
        wait_until(lambda: list(journal.records(kinds=["attempt_start"])), 60, 0.5, "the job to start")
        time.sleep(3)  # srun has started the loop in the image
        Submitter(load_site("dev"), ledger).submit(JobSpec.model_validate(HIGH), "<high>")
        ends = lambda: [r for _, r in journal.records(kinds=["attempt_end"])]  # noqa: E731
        wait_until(lambda: any(r["requeued"] for r in ends()), 120, 0.5, "the preempted loop to requeue")
        assert finish(ledger, job["id"], timeout=180) == "COMPLETED"
    assert [r["cause"] for r in ends()] == ["preemption", "completed"]
    assert json.loads(state.read_text()) == {"step": 60, "total": 60 * 61 // 2}
    logs = run_cli("logs", str(job["id"]))
    assert logs.returncode == 0, logs.stderr
    assert "==> attempt 0 began" in logs.stdout and "==> attempt 1 began" in logs.stdout
    assert "stopped at step" in logs.stdout and logs.stdout.rstrip().endswith("done")
