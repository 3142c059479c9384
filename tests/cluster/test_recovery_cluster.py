"""Recovery round 2 (issue 58) on the dev cluster, for users' own code: a loop that prints a line a step under
`[hang] output_s` is never declared hung and its whole output reaches the log; a Hugging Face run whose random
collator is not wrapped in BatchSeeded is told at its start, in its log and in `show`, that its resume will not be
bitwise."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.contract import JobPaths
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.cluster import finish
from helpers.lanes import lanes
from helpers.paths import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              lanes(why="the task shim's and Python's buffering, hpctrain's own callback: alike on every release")]
RESOURCES = {"mem": "2G", "time": "00:10:00", "account": "teama", "gpus_per_node": 2, "tasks_per_node": 1}


def submitted(ledger: Ledger, spec: dict) -> dict:
    sub = Submitter(load_site("dev"), ledger).submit(JobSpec.model_validate(spec), "<test>")
    return ledger.jobs.get(sub.ledger_ids[0])


def test_a_loop_printing_a_line_a_step_under_output_s_is_never_hung_and_logs_every_line(dev_cluster,
                                                                                        isolated_ledger, tmp_path):
    """A plain `print` a step with stdout piped under srun: Python buffered 8 KiB, the log stayed quiet, and the
    loop was declared hung twice while training. 400 lines of 21 bytes in 20 s, under `output_s = 10`."""
    loop = tmp_path / "loop.py"
    loop.write_text("import time\nfor step in range(400):\n    print(f'step {step:03d} loss {1 / (step + 1):.5f}')\n"
                    "    time.sleep(0.05)\n")
    with Ledger(isolated_ledger) as ledger:
        job = submitted(ledger, {"name": "printing", "command": [sys.executable, str(loop)], "resources": RESOURCES,
                                 "hang": {"output_s": 10}})
        assert finish(ledger, job["id"], timeout=300) == "COMPLETED"
    journal = Journal(JobPaths(Path(job["job_dir"])).journal_dir)
    assert not list(journal.records(kinds=["hang"]))
    log = JobPaths(Path(job["job_dir"])).output(job["slurm_job_id"]).read_text()
    printed = [m[1] for line in log.splitlines() if (m := re.fullmatch(r"(?:\d+: )?(step \d{3} loss [0-9.]+)", line))]
    assert printed == [f"step {s:03d} loss {1 / (s + 1):.5f}" for s in range(400)]  # srun --label: "0: " first


def test_a_trainer_whose_random_collator_is_not_batch_seeded_is_warned_at_start_and_in_show(dev_cluster,
                                                                                           isolated_ledger, tmp_path):
    """The example's masking collator as a user would pass it, without hpctrain's BatchSeeded: its resume would
    differ from step 23 on. One line at the start in the log, the event in `show`."""
    script = tmp_path / "unseeded.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'scripts' / 'examples')!r})\nimport hf_trainer\n"
                      "hf_trainer.BatchSeeded = lambda collator: collator  # not wrapped\n"
                      f"sys.argv = ['hf_trainer.py', {str(tmp_path / 'out')!r}, '--steps', '4', '--mlm']\n"
                      "sys.exit(hf_trainer.main())\n")
    with Ledger(isolated_ledger) as ledger:
        job = submitted(ledger, {"name": "unseeded", "command": [sys.executable, str(script)], "resources": RESOURCES})
        assert finish(ledger, job["id"], timeout=300) == "COMPLETED"
    log = JobPaths(Path(job["job_dir"])).output(job["slurm_job_id"]).read_text()
    warned = [line for line in log.splitlines() if "this run's resume will not be bitwise: " in line]
    assert len(warned) == 1, log[-3000:]
    assert run_cli("reconcile").returncode == 0
    shown = run_cli("show", str(job["id"]))
    assert "resume_not_bitwise: this run's resume will not be bitwise: " in " ".join(shown.stdout.split()), shown.stdout
