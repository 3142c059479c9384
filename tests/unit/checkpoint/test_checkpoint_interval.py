"""The checkpoint interval "auto" chooses (hpctrain.checkpoint.interval): Daly's optimum for a save's cost and the
rate of interruptions that lose work, never shorter than a save blocks or takes to commit nor longer than the site's
cap, the rate learnt from the job's own interruptions on top of the site's prior."""

import math

import pytest

from hpctrain.checkpoint.interval import (
    MAX_INTERVAL_S,
    MIN_COST_S,
    InterruptionRate,
    choose_interval,
    daly_interval_s,
    interval_s,
)
from hpctrain.config.site import CheckpointConfig


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
    # 30 preemptions in 10 hours outweigh a prior of one in 2 h, weighted 1/31: about one in 20 minutes.
    busy = InterruptionRate(30, 10 * 3600.0, prior_s=2 * 3600)
    assert busy.mtbi_s == pytest.approx((2 * 3600 / 31 + 10 * 3600) / (1 / 31 + 30))
    assert busy.describe() == "one every 20.1 min (30 in 10.0 h seen, prior one in 2 h)"
    assert prior.describe() == "one every 2.00 h (none seen yet, prior one in 2 h)"
    assert InterruptionRate(999, 3600.0, prior_s=3600).describe().startswith("one every 3.6 s (999 in 1.0 h seen")
    # A prior far off is no anchor for a long history: 1,151 in 6 h against one a day is one in 18.8 s (weighted
    # whole, the prior's day held it at one in 94 s, and "auto" saved 2.5x too seldom: benchmarks/interval_real.py).
    assert InterruptionRate(1151, 6 * 3600.0).mtbi_s == pytest.approx(6 * 3600 / 1151, rel=0.01)


def test_the_interval_in_steps_never_ends_before_the_last_save_has_committed():
    rate = InterruptionRate(0, 0.0, prior_s=3600)
    quick = choose_interval(cost_s=1.0, commit_s=2.0, step_s=0.5, rate=rate)
    assert quick.steps == round(daly_interval_s(1.0, 3600) / 0.5) and quick.seconds == quick.steps * 0.5
    slow_commit = choose_interval(cost_s=1.0, commit_s=600.0, step_s=0.5, rate=rate)
    assert slow_commit.steps == 1200  # 600 s: saves do not pile up
    # An async save's millisecond is taken as MIN_COST_S.
    assert choose_interval(0.001, 0.0, 1.0, rate).steps == round(daly_interval_s(MIN_COST_S, 3600))
    assert "a save blocks 1.000 s and commits in 2.0 s, a step takes 0.500 s" in quick.why(rate)
    assert "interruptions that lose work one every 1.00 h" in quick.why(rate)


def test_a_preemptible_jobs_prior_counts_failures_not_the_preemptions_its_notice_saves_on():
    """Issue 56.11: preemptions every 2 h and failures every 24 h: a 56 s save comes every 3,074 s (Daly's for the
    failures), not every 826 s, unless the site says its preemptions come without a notice in time to save."""
    site = CheckpointConfig()
    assert site.prior_mtbi_s(preemptible=True) == site.prior_mtbi_s(preemptible=False) == 24 * 3600
    assert interval_s(56.0, 56.0, site.prior_mtbi_s(preemptible=True)) == pytest.approx(3074, abs=1)
    no_grace = CheckpointConfig(preemptible_mtbi_hours=2)
    assert (no_grace.prior_mtbi_s(True), no_grace.prior_mtbi_s(False)) == (7200, 24 * 3600)


def test_the_interval_is_capped_from_above_and_never_shorter_than_a_save_blocks():
    """A rate of interruptions that hardly ever comes saves at the cap (the site's max_interval_minutes), not once a
    month; a save longer than the time between interruptions is not repeated more often than it lasts."""
    calm = InterruptionRate(0, 0.0, prior_s=1e9)
    assert daly_interval_s(56.0, calm.mtbi_s) > 10 * MAX_INTERVAL_S
    assert choose_interval(56.0, 56.0, 1.0, calm).seconds == MAX_INTERVAL_S
    assert choose_interval(56.0, 56.0, 1.0, calm, max_s=600.0).steps == 600
    assert choose_interval(56.0, 700.0, 1.0, calm, max_s=600.0).steps == 700  # the commit wins: saves never pile up
    storm = InterruptionRate(0, 0.0, prior_s=6.0)  # a save of 10 s, interruptions every 6 s
    assert choose_interval(10.0, 0.0, 0.5, storm).seconds == 10.0
