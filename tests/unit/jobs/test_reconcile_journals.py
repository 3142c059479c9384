"""The refresh before status and the other read commands lists a journal directory only if it changed since it was
last read through (issue 59: 1,960 listed on every command)."""

from __future__ import annotations

import os
import time

from hpctrain.jobs.reconcile import read_journals
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table


def test_only_the_journals_written_to_since_are_listed_again(isolated_ledger, tmp_path, monkeypatch):
    listed: list[str] = []
    names = Journal.names
    monkeypatch.setattr(Journal, "names", lambda self, kinds=None: listed.append(self.dir.name) or names(self, kinds))
    with Ledger(isolated_ledger) as ledger:
        journals = []
        for n in range(3):
            job = Table(ledger, "jobs").insert({"name": f"j{n}", "site": "dev", "state": "RUNNING"})
            journal = Journal(tmp_path / f"job{n}" / "journal")
            for step in (1, 2):
                journal.write("event", job_id=job, message=f"step {step}")
            old = time.time() - 120  # written two minutes ago
            os.utime(journal.dir, (old, old))
            journals.append(journal)
        missing = str(tmp_path / "pending" / "journal")  # a job not started: no journal yet
        dirs = [str(j.dir) for j in journals]

        assert read_journals(ledger, [*dirs, missing]) == 6 and len(listed) == 3  # nothing to list: no folder
        listed.clear()
        assert read_journals(ledger, [*dirs, missing]) == 0 and listed == []
        journals[1].write("event", job_id=2, message="step 3")
        listed.clear()
        assert read_journals(ledger, dirs) == 1 and len(listed) == 1
        listed.clear()  # written just now: its mtime is not trusted yet, so it is listed again
        assert read_journals(ledger, dirs) == 0 and len(listed) == 1
        assert ledger.db.execute("SELECT count(*) FROM events").fetchone()[0] == 7
