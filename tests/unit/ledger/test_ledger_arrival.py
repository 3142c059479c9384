"""The ledger's order of arrival (`seq`): every metric value and evaluation result written or changed takes the next
number, whatever clock its node had; the same value written again keeps its number; the ledger's id stays."""

from __future__ import annotations

from hpctrain.ledger import Ledger


def test_values_are_numbered_as_they_arrive_and_again_when_they_change(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        ledger.metrics.record(job, -1, 1, {"loss": 2.0}, 0, 200.0)
        ledger.metrics.record(job, -1, 2, {"loss": 1.5}, 0, 100.0)  # a node's clock behind
        first = [(s, name, step) for s, name, step, _, _ in ledger.metrics.after(job, -1, 0)]
        assert [(name, step) for _, name, step in first] == [("loss", 1), ("loss", 2)] and first[0][0] < first[1][0]
        ledger.metrics.record(job, -1, 2, {"loss": 1.5}, 1, 100.0)  # the same value again: nothing new
        assert ledger.metrics.after(job, -1, first[1][0]) == []
        ledger.metrics.record(job, -1, 1, {"loss": 1.9}, 1, 90.0)  # step 1 recomputed
        assert [(name, step, value) for _, name, step, value, _ in ledger.metrics.after(job, -1, first[1][0])] == [
            ("loss", 1, 1.9)]
        ledger.evaluations.done(job, -1, 2, "heldout", {"eval/loss": 3.0}, 50.0)
        [evaluation] = ledger.evaluations.done_after(job, -1, first[1][0])
        assert evaluation["seq"] > ledger.metrics.after(job, -1, 0)[-1][0]
        ledger.evaluations.done(job, -1, 2, "heldout", {"eval/loss": 3.0}, 60.0)  # reported again, same values
        assert ledger.evaluations.done_after(job, -1, evaluation["seq"]) == []
        ledger.evaluations.done(job, -1, 2, "heldout", {"eval/loss": 2.0}, 40.0)
        assert [e["metrics_json"] for e in ledger.evaluations.done_after(job, -1, evaluation["seq"])] == [
            '{"eval/loss": 2.0}']
        identity = ledger.exports.ledger_id()
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.exports.ledger_id() == identity and len(identity) == 32
