"""The checkpoint interval "auto" chooses (hpctrain.checkpoint.interval): Daly's optimum for a save's cost and the
interruption rate, never shorter than a save takes to commit, the rate learnt from the job's own interruptions on
top of the site's prior."""

import math

import pytest

from hpctrain.checkpoint.interval import MIN_COST_S, InterruptionRate, choose_interval, daly_interval_s


@pytest.mark.parametrize("cost_s, mtbi_s", [(1.0, 3600.0), (56.0, 1800.0), (0.05, 86400.0)])
def test_dalys_interval_is_youngs_square_root_with_the_higher_order_terms(cost_s, mtbi_s):
    young = math.sqrt(2 * cost_s * mtbi_s)
    daly = daly_interval_s(cost_s, mtbi_s)
    assert young - cost_s < daly < young  # the correction subtracts about one save and adds a little back
    # It is the least loss of C/T + T/(2M) (the first-order model) within the higher-order terms' reach.
    loss = lambda t: cost_s / t + t / (2 * mtbi_s)  # noqa: E731
    assert loss(daly) <= 1.01 * loss(young)
    assert daly_interval_s(2 * mtbi_s, mtbi_s) == mtbi_s  # a save as long as the time between interruptions


def test_the_rate_starts_from_the_prior_and_follows_the_history():
    prior = InterruptionRate(0, 0.0, prior_s=2 * 3600)
    assert prior.mtbi_s == 2 * 3600
    # 30 preemptions in 10 hours outweigh a prior of one in 2 h: about one in 20 minutes.
    busy = InterruptionRate(30, 10 * 3600.0, prior_s=2 * 3600)
    assert busy.mtbi_s == pytest.approx(12 * 3600 / 31)
    assert busy.describe() == "one every 23.2 min (30 in 10.0 h seen, prior one in 2 h)"
    assert prior.describe() == "one every 2.00 h (none seen yet, prior one in 2 h)"
    assert InterruptionRate(999, 3600.0, prior_s=3600).describe().startswith("one every 7.2 s (999 in 1.0 h seen")


def test_the_interval_in_steps_never_ends_before_the_last_save_has_committed():
    rate = InterruptionRate(0, 0.0, prior_s=3600)
    quick = choose_interval(cost_s=1.0, commit_s=2.0, step_s=0.5, rate=rate)
    assert quick.steps == round(daly_interval_s(1.0, 3600) / 0.5) and quick.seconds == quick.steps * 0.5
    slow_commit = choose_interval(cost_s=1.0, commit_s=600.0, step_s=0.5, rate=rate)
    assert slow_commit.steps == 1200  # 600 s: saves do not pile up
    # An async save's millisecond is taken as MIN_COST_S.
    assert choose_interval(0.001, 0.0, 1.0, rate).steps == round(daly_interval_s(MIN_COST_S, 3600))
    assert "a save blocks 1.000 s and commits in 2.0 s, a step takes 0.500 s" in quick.why(rate)
