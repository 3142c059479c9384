"""Submissions whose submitter died before recording Slurm's answer: settled only once no submitter holds the lock
(the cluster test kills real submissions at each step, with reconciles beside them)."""

import subprocess
import sys
import textwrap
import time

from hpctrain.jobs.unsent import KILLED, settle_unsent
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

# A submitter in another process: holds the lock, says so, and waits for its stdin to close.
HOLDER = textwrap.dedent("""
    import sys
    from hpctrain.jobs.unsent import submitting
    from hpctrain.ledger import Ledger
    with Ledger(sys.argv[1]) as ledger, submitting(ledger):
        print("held", flush=True)
        sys.stdin.read()
""")


def test_a_row_is_settled_only_once_no_submitter_holds_the_lock(tmp_path):
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        job_id = ledger.jobs.record({"name": "j", "site": "dev"})  # SUBMITTING; killed before its script was written
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            assert settle_unsent(ledger, None, "dev") == []  # type: ignore[arg-type]  # nothing asked of Slurm
            assert ledger.jobs.get(job_id)["state"] == "SUBMITTING"
        finally:
            holder.communicate("")
        # no sbatch could have run without a script: no Slurm call either
        assert settle_unsent(ledger, None, "dev") == [f"job {job_id}: {KILLED}"]  # type: ignore[arg-type]
        row = ledger.jobs.get(job_id)
        assert (row["state"], row["error"]) == ("SUBMIT_FAILED", KILLED)
        assert [e["kind"] for e in Table(ledger, "events").rows()] == ["submit_failed"]
        assert settle_unsent(ledger, None, "dev") == []  # type: ignore[arg-type]


class Found:
    """A controller that holds the job's sbatch under its comment."""

    def find_by_comment(self, comment: str) -> str:
        return "77"


def test_a_job_found_again_counts_as_submitted_when_it_was_recorded(tmp_path):
    """Not when it was found: Slurm's rows under its id from before then are another job's (the Poller's floor)."""
    with Ledger(tmp_path / "l.db") as ledger:
        job_id = ledger.jobs.record({"name": "j", "site": "dev"})
        ledger.jobs.set_script(job_id, str(tmp_path / "job.sh"), str(tmp_path), "0" * 64)
        recorded = ledger.jobs.get(job_id)["updated_at"]
        time.sleep(0.05)
        assert settle_unsent(ledger, Found(), "dev") == [  # type: ignore[arg-type]
            f"job {job_id}: slurm job 77, found again after its submitter was killed"]
        row = ledger.jobs.get(job_id)
        assert (row["state"], row["slurm_job_id"], row["submitted_at"]) == ("PENDING", "77", recorded)
