"""Submissions whose submitter died before recording Slurm's answer: settled only once no submitter holds the lock
(the cluster test kills real submissions at each step, with reconciles beside them)."""

import subprocess
import sys
import textwrap

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
