"""The GPU timeline of a settled job thinned to a plot's worth (issue 61: a row a node and minute is 2.9 kB a
GPU-hour), each GPU's percent averaged and its memory's peak kept."""

from __future__ import annotations

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

POLICY = {"below_percent": 5, "after_s": 60, "alert_s": 600}


def minutes(ledger: Ledger, job: int, node: str, count: int) -> None:
    """``count`` minutes of two GPUs on ``node``: GPU 0 at 0, 30, 60, 90, 0, ... percent, GPU 1 idle; memory rising."""
    key = {"job_id": job, "task_index": -1, "attempt": 0, "step_restart": 0}
    points = [(60.0 * m, d, float(30 * (m % 4) if d == "0" else 0), float(m * 2**20))
              for m in range(count) for d in ("0", "1")]
    ledger.gpus.record(key, node, "nvml", {}, POLICY, points, 60.0 * count, True)


def test_a_long_timeline_is_thinned_and_a_short_one_kept(isolated_ledger):
    with Ledger(isolated_ledger) as ledger:
        long, short = (Table(ledger, "jobs").insert({"name": n, "site": "dev", "state": "COMPLETED"})
                       for n in ("long", "short"))
        minutes(ledger, long, "n1", 300)
        minutes(ledger, long, "n2", 100)
        minutes(ledger, short, "n1", 50)
        assert ledger.gpus.thin([long, short], 120) == 200  # n1's 300 minutes in 100 runs of 3
        rows = ledger.gpus.timeline(long)
        n1 = [r for r in rows if r.node == "n1"]
        assert len(n1) == 100 and len([r for r in rows if r.node == "n2"]) == 100
        assert [r.at for r in n1[:2]] == [0.0, 180.0]
        assert n1[0].util == {"0": 30, "1": 0} and n1[1].util == {"0": 40, "1": 0}  # (0+30+60)/3, (90+0+30)/3
        assert n1[0].mem == {"0": 2, "1": 2} and n1[-1].mem["0"] == 299
        assert len(ledger.gpus.timeline(short)) == 50
        assert ledger.gpus.thin([long, short], 120) == 0  # thinned once
