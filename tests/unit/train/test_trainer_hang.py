"""The reference trainer arms every phase's watchdog with the job's merged [hang] timeouts: the spec's, the site's
where the spec sets none (a site's [hang] with a spec that set none once crashed every rank at its first step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config.job import JobSpec
from hpctrain.train import __main__ as trainer

from helpers.paths import REPO


class Armed:
    """A stand-in for the rank's Watchdog that records each phase armed and its timeout."""

    made: list["Armed"] = []

    def __init__(self) -> None:
        self.phases: list[tuple[str, float]] = []
        self.closed = False
        Armed.made.append(self)

    def phase(self, name: str, timeout_s: float) -> None:
        self.phases.append((name, timeout_s))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def armed(monkeypatch) -> list[Armed]:
    Armed.made = []
    monkeypatch.setattr(trainer, "Watchdog", Armed)
    return Armed.made


def job_site(tmp_path: Path, monkeypatch, hang: str) -> None:
    """Run as a job of a site whose [hang] is ``hang`` ('' for none)."""
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text() + (f"\n[hang]\n{hang}\n" if hang else ""))
    monkeypatch.setenv("HPCTRAIN_SITE", str(site))


def run_phases(spec_hang: dict) -> None:
    watchdog = trainer.RankWatchdog(JobSpec(name="j", command=["true"], hang=spec_hang))
    watchdog.phase("start-up")
    watchdog.phase("step")
    watchdog.phase("step")
    watchdog.close()


def test_each_phase_is_armed_with_the_sites_timeout_where_the_spec_sets_none(tmp_path, monkeypatch, armed):
    job_site(tmp_path, monkeypatch, "startup_s = 600\nstep_s = 120")
    run_phases({})
    (dog,) = armed
    assert dog.phases == [("start-up", 600), ("step", 120), ("step", 120)] and dog.closed


def test_the_specs_timeouts_come_first_phase_by_phase(tmp_path, monkeypatch, armed):
    job_site(tmp_path, monkeypatch, "startup_s = 600\nstep_s = 120")
    run_phases({"step_s": 30})
    run_phases({"startup_s": 0})  # 0: that phase is not watched
    assert [dog.phases for dog in armed] == [[("start-up", 600), ("step", 30), ("step", 30)],
                                             [("start-up", 0), ("step", 120), ("step", 120)]]


def test_no_watchdog_without_timeouts(tmp_path, monkeypatch, armed):
    job_site(tmp_path, monkeypatch, "")
    run_phases({})
    monkeypatch.delenv("HPCTRAIN_SITE")
    run_phases({"step_s": 0})
    assert armed == []
