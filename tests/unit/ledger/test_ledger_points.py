"""A job's curves as a report reads them (`Metrics.points`): every value of a short series, and of a long one the
lowest and highest value of each range of steps, chosen in SQL, with its first and last values exact (issue 59: a
500,000-point job took 1 s to read and more to draw)."""

from __future__ import annotations

import math

from hpctrain.ledger import Ledger


def test_a_long_series_gives_its_lows_and_highs_a_spike_included_and_a_short_one_everything(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "long", "site": "dev"})
        loss = {step: 3 / math.sqrt(step) + 0.01 * math.sin(step) for step in range(1, 20_001)}
        loss[12_345] = 9.0  # one spike
        with ledger.transaction():
            for step, value in loss.items():
                ledger.metrics.record(job, 0, step, {"loss": value, "lr": 0.1 if step <= 10 else None}, 0, step)
        points = [p for p in ledger.metrics.points(job, most=400)]
    drawn = [(step, value) for name, task, step, value in points if name == "loss" and task == 0]
    assert 200 <= len(drawn) <= 402 and [s for s, _ in drawn] == sorted({s for s, _ in drawn})
    assert drawn[0] == (1, loss[1]) and drawn[-1] == (20_000, loss[20_000])
    assert (12_345, 9.0) in drawn and min(v for _, v in drawn) == min(loss.values())
    assert all(loss[step] == value for step, value in drawn)  # values as recorded, at their own steps
    # of each range of 100 steps its low and its high: none left out
    for start in range(1, 20_001, 100):
        in_range = {s: loss[s] for s in range(start, start + 100)}
        assert {min(in_range, key=in_range.get), max(in_range, key=in_range.get)} <= {s for s, _ in drawn}
    # a series within the bound, and any series without one: every value
    assert [(s, v) for name, _, s, v in points if name == "lr"] == [(s, 0.1) for s in range(1, 11)]
    with Ledger(tmp_path / "l.db") as ledger:
        assert len([p for p in ledger.metrics.points(job) if p[0] == "loss"]) == 20_000
