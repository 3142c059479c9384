"""Where a job would start soonest (issue 63): Slurm's `--test-only` answer read, its estimate blended with the
ledger's past waits of jobs alike, and the choice of `submit --soonest`. The cluster tests rank real candidates."""

import pytest

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.slurm.parse import parse_test_only
from hpctrain.submit.placement import Placement
from hpctrain.submit.soonest import Candidate, Ranking, chosen, predict

NOW = 1_800_000_000.0


def test_the_test_only_answer_is_read_and_a_refusal_is_not_an_estimate():
    said = "sbatch: Job 681615 to start at 2026-12-03T17:21:56 using 1 processors on nodes n3 in partition gpu\n"
    assert parse_test_only(said) == ("2026-12-03T17:21:56", "n3", "gpu")
    said_by_26_05 = "sbatch: Job 981732 to start at 2026-12-03T16:33:38 a using 4 processors on nodes n1 in partition debug"
    assert parse_test_only(said_by_26_05) == ("2026-12-03T16:33:38", "n1", "debug")
    assert parse_test_only("allocation failure: Requested node configuration is not available\n") is None


def test_a_start_slurm_sees_free_now_is_now_whatever_the_history():
    assert predict(NOW + 3, [7200.0] * 30, NOW) == (NOW, "Slurm: free now; 30 job(s) alike waited 2.0 h (median)")
    assert predict(NOW + 4 * 3600, [], NOW) == (NOW + 4 * 3600, "Slurm: in 4.0 h (no job alike in the ledger)")


def test_enough_past_waits_that_disagree_with_slurm_change_the_ranking():
    # Slurm counts the time limits of the jobs ahead: 4 h in `gpu`, 2 h in `long`. The user's own jobs in `gpu`
    # started within 10 minutes, twenty times: ended early, as most jobs do.
    alone, _ = predict(NOW + 2 * 3600, [], NOW)
    few, _ = predict(NOW + 4 * 3600, [600.0] * 2, NOW)
    many, basis = predict(NOW + 4 * 3600, [600.0] * 20, NOW)
    assert few > alone > many
    assert many == pytest.approx(NOW + 0.2 * 4 * 3600 + 0.8 * 600)
    assert basis == "history (80% history): Slurm in 4.0 h; 20 job(s) alike waited 10 min (median)"


def test_a_limit_on_running_jobs_is_waited_for_whatever_slurm_says():
    """`sbatch --test-only` leaves out QOS and association limits on running jobs: a candidate that waits for one
    starts when the history says, else at an unknown time, after every candidate free of limits."""
    cap = "it will wait: QOS normal's running GPUs per user cap: 4 of 4 in use"
    assert predict(NOW, [], NOW, (cap,)) == (None, "waits for a limit: QOS normal's running GPUs per user cap: 4 of 4 "
                                                   "in use (Slurm's estimate leaves limits out; no job alike in the "
                                                   "ledger)")
    start, basis = predict(NOW, [1800.0] * 3, NOW, (cap,))
    assert start == NOW + 1800 and basis.startswith("history: waits for a limit: QOS normal's")
    assert predict(NOW + 7200, [1800.0], NOW, (cap,))[0] == NOW + 7200  # never sooner than Slurm's
    free = Candidate(Placement("gpu", "low", "teama", "named"), NOW + 600, NOW + 600, "n1", (), "Slurm")
    held = Candidate(Placement("gpu", "normal", "teama", "named", (cap,)), None, NOW, "n1", (), "waits")
    assert chosen(Ranking([free, held], []), "job.toml", NOW).qos == "low"
    assert "over gpu/normal as teama after a limit" in chosen(Ranking([free, held], []), "job.toml", NOW).reason


@pytest.mark.parametrize(("preemptible", "choices"), [
    (False, [{}]), (True, [{}]), ("allowed", [{"preemptible": False}, {"qos": None, "preemptible": True}])])
def test_a_spec_that_allows_preemption_is_ranked_in_both_qos(preemptible, choices):
    from hpctrain.config.job import JobSpec
    from hpctrain.submit.soonest import _qos_choices

    spec = JobSpec.model_validate({"name": "j", "command": ["true"], "resources": {"preemptible": preemptible}})
    assert [choice for _, choice in _qos_choices(spec)] == choices


def test_the_waits_alike_are_the_first_starts_of_jobs_like_it(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        jobs = Table(ledger, "jobs")

        def job(submitted, waited, partition="gpu", account="teama", gpus=4, is_array=0, attempt=0):
            job_id = jobs.insert({"name": "j", "site": "dev", "state": "COMPLETED", "partition": partition,
                                  "account": account, "qos": "normal", "submitted_at": submitted,
                                  "is_array": is_array})
            ledger.attempts.record(job_id, 0 if is_array else -1, attempt, started_at=submitted + waited,
                                   alloc_gpus=gpus)

        job(NOW - 100, 30.0)
        job(NOW - 200, 60.0, is_array=1)  # its task 0's first run
        job(NOW - 300, 90.0, partition="debug")
        job(NOW - 400, 120.0, account="teamb")
        job(NOW - 500, 150.0, gpus=8)
        job(NOW - 600, 180.0, attempt=1)  # a requeued run is no wait for a start
        job(NOW - 40 * 86400, 210.0)  # before the window
        assert ledger.jobs.waits_alike("dev", "gpu", "teama", "normal", 4, NOW - 30 * 86400) == [30.0, 60.0]


def test_each_source_is_scored_against_the_first_starts_of_the_jobs_placed_by_their_start(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        jobs = Table(ledger, "jobs")
        for k, (predicted, slurm, started) in enumerate([(NOW, NOW + 3600, NOW + 600), (NOW, NOW, NOW + 60),
                                                         (None, None, NOW + 5)]):
            job_id = jobs.insert({"name": "j", "site": "dev", "state": "RUNNING", "submitted_at": NOW - k,
                                  "is_array": 0})
            starts = {"predicted_start": predicted, "slurm_start": slurm} if predicted else {}
            ledger.event("placement", "why", job_id=job_id, **starts)
            ledger.attempts.record(job_id, -1, 0, started_at=started)
        assert ledger.events.start_errors("dev", NOW - 86400) == [(600.0, -3000.0), (60.0, 60.0)]


def test_submit_soonest_takes_the_first_and_says_why_or_refuses_in_one_line():
    def candidate(partition, start):
        return Candidate(Placement(partition, "normal", "teama", "account named"), start, start, "n1", (), "Slurm")

    placement = chosen(Ranking([candidate("debug", NOW), candidate("gpu", NOW + 3600)], []), "job.toml", NOW)
    assert (placement.partition, placement.reason) == (
        "debug", "soonest: debug/normal as teama now (Slurm) over gpu/normal as teama in 1.0 h")
    with pytest.raises(HpctrainError) as refused:
        chosen(Ranking([], ["partition debug: resources.time: 02:00:00 requested, partition 'debug' allows 01:00:00",
                            "gpu as teamb: resources.account: user 'u' has no association with account 'teamb'"]),
               "job.toml")
    assert str(refused.value) == (
        "job.toml: no placement can run it: partition debug: resources.time: 02:00:00 requested, partition 'debug' "
        "allows 01:00:00; gpu as teamb: resources.account: user 'u' has no association with account 'teamb'")


def test_an_array_cannot_race():
    from hpctrain.config.job import JobSpec
    from hpctrain.errors import ConfigError
    from hpctrain.submit.racing import submit_race

    spec = JobSpec.model_validate({"name": "a", "command": ["true"], "array": {"count": 2}})
    with pytest.raises(ConfigError) as refused:
        submit_race(None, spec, "job.toml", Ranking([], []), 2)  # type: ignore[arg-type]
    assert str(refused.value) == "job.toml: array: a race runs one job: an array cannot race"


def test_a_job_placed_on_one_shape_is_submitted_with_every_shape_its_partition_holds(monkeypatch):
    """`submit --soonest` chose 1 node in debug (2 nodes): the job is recorded on 1 node and may be given 2, never
    3, by Slurm (its range: `Resources.slurm_nodes`)."""
    from hpctrain.config import load_site
    from hpctrain.config.job import JobSpec
    from hpctrain.submit.soonest import as_submitted

    monkeypatch.delenv("HPCTRAIN_DEV_ROOT", raising=False)
    spec = JobSpec.model_validate({"name": "s", "command": ["true"], "resources": {"nodes": [3, 2, 1]}})
    debug = Placement("debug", "normal", "teama", "soonest", shape=1)
    submitted = as_submitted(spec, debug, load_site("dev")).resources
    assert (submitted.nodes, submitted.shapes, submitted.partition) == (1, [2, 1], "debug")
    assert as_submitted(spec, Placement("gpu", "normal", "teama", "x", shape=3), load_site("dev")).resources.shapes == [
        3, 2, 1]


def test_a_race_across_clusters_without_one_logs_folder_is_refused_and_records_nothing(tmp_path):
    """Each runner claims the race in a file of the logs folder: clusters that name different ones cannot race."""
    from hpctrain.config import load_site
    from hpctrain.config.job import JobSpec
    from hpctrain.errors import ConfigError
    from hpctrain.submit import Submitter
    from hpctrain.submit.racing import submit_race

    dev = load_site("dev")
    other = dev.model_copy(update={"name": "c2", "paths": dev.paths.model_copy(update={"logs": tmp_path / "c2"})})
    spec = JobSpec.model_validate({"name": "a", "command": ["true"], "launcher": "none"})
    ranking = Ranking([Candidate(Placement("gpu", "normal", "teama", "x", site=s), 1.0, 1.0, "n1", (), "Slurm")
                       for s in ("dev", "c2")], [])
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(ConfigError) as refused:
            submit_race([Submitter(dev, ledger, None), Submitter(other, ledger, None)],  # type: ignore[arg-type]
                        spec, "job.toml", ranking, 2)
        assert Table(ledger, "jobs").rows() == []
    assert str(refused.value) == (
        "job.toml: a race across clusters needs one logs folder they all see ([paths] logs): site dev's is "
        f"{dev.paths.logs}, site c2's is {tmp_path / 'c2'}")
