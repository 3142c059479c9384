"""Every phase's watchdog is armed with the job's merged [hang] timeouts: the spec's, the site's where the spec sets
none (a site's [hang] with a spec that set none once crashed every rank at its first step); the reference trainer
arms its phases, a user's loop is timed through hpctrain's guard."""

from __future__ import annotations

from pathlib import Path

import json

import pytest

from hpctrain.config.job import JobSpec
from hpctrain.runtime import watchdog
from hpctrain.runtime.function import CallGuard
from hpctrain.runtime.guard import PreemptionGuard

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
    monkeypatch.setattr(watchdog, "Watchdog", Armed)
    return Armed.made


def job_site(tmp_path: Path, monkeypatch, hang: str) -> None:
    """Run as a job of a site whose [hang] is ``hang`` ('' for none)."""
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text() + (f"\n[hang]\n{hang}\n" if hang else ""))
    monkeypatch.setenv("HPCTRAIN_SITE", str(site))


def run_phases(spec_hang: dict) -> None:
    dog = watchdog.RankWatchdog(watchdog.hang_timeouts(JobSpec(name="j", command=["true"], hang=spec_hang)))
    dog.phase("start-up")
    dog.phase("step")
    dog.phase("step")
    dog.close()


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


def in_job(tmp_path: Path, monkeypatch, hang: dict) -> None:
    """Run in an hpctrain job whose spec's [hang] is ``hang``."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "loop", "command": ["python", "loop.py"], "hang": hang}))
    monkeypatch.setenv("HPCTRAIN_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("HPCTRAIN_SPEC", str(spec))
    monkeypatch.delenv("HPCTRAIN_SITE", raising=False)


def test_the_guard_times_a_users_loop_from_one_question_to_the_next(tmp_path, monkeypatch, armed):
    """Start-up from the guard's creation to its first `should_stop()`, then a step per call; the loop's end is not
    timed. A submitted call's guard starts timing at the call's first question (a call that never asks is not
    watched); hpctrain's trainer times its own phases."""
    in_job(tmp_path, monkeypatch, {"startup_s": 60, "step_s": 5})
    guard = PreemptionGuard()
    assert not guard.should_stop() and not guard.should_stop()
    guard.end_watch()
    guard.uninstall()
    call = CallGuard(rank=0)
    call.should_stop()
    call.uninstall()
    PreemptionGuard(watch=False).uninstall()
    assert [(dog.phases, dog.closed) for dog in armed] == [
        ([("start-up", 60), ("step", 5), ("step", 5)], True), ([("step", 5)], True)]
    in_job(tmp_path, monkeypatch, {})
    PreemptionGuard().uninstall()
    monkeypatch.delenv("HPCTRAIN_JOB_DIR")
    PreemptionGuard().uninstall()
    assert len(armed) == 2


def test_hang_timeouts_the_spec_leaves_unset_come_from_the_jobs_site_config(tmp_path, monkeypatch):
    def spec(hang: dict) -> JobSpec:
        return JobSpec(name="j", command=["true"], hang=hang)

    monkeypatch.delenv("HPCTRAIN_SITE", raising=False)
    assert watchdog.hang_timeouts(spec({})).model_dump() == {"startup_s": 0, "step_s": 0, "output_s": 0, "buffered_output": False}
    job_site(tmp_path, monkeypatch, "startup_s = 600\nstep_s = 120\noutput_s = 900")
    assert watchdog.hang_timeouts(spec({})).model_dump() == {"startup_s": 600, "step_s": 120, "output_s": 900, "buffered_output": False}
    assert watchdog.hang_timeouts(spec({"step_s": 30})).model_dump() == {"startup_s": 600, "step_s": 30, "output_s": 900, "buffered_output": False}
    # 0: off
    assert watchdog.hang_timeouts(spec({"startup_s": 0})).model_dump() == {"startup_s": 0, "step_s": 120, "output_s": 900, "buffered_output": False}


def test_the_trainers_first_step_is_timed_as_start_up(tmp_path):
    """The reference trainer's first step (its collectives' set-up, the loader's first batch) is start-up's: a first
    step 6 s long under `step_s = 1` is no hang (a restart under CI's load was once called hung at its first step);
    a later step that long is (its stacks written at 1 s, the rank ended 3 s later)."""
    from helpers.train import tiny_spec, torchrun

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**tiny_spec().model_dump(mode="json", by_alias=True, exclude_none=True),
                                "hang": {"startup_s": 120, "step_s": 1}}))
    env = {"HPCTRAIN_SPEC": str(spec), "HPCTRAIN_JOB_DIR": str(tmp_path)}
    torchrun(1, "-m", "helpers.patched_run", "3", "if calls[0] == 1: time.sleep(6)", env=env)
    (stacks,) = (tmp_path / "stacks").glob("*rank0.txt")
    text = stacks.read_text()
    assert [ln.split(",")[0] for ln in text.splitlines() if ln.startswith("phase ")] == [
        "phase start-up", "phase step"] and "Timeout" not in text
    with pytest.raises(AssertionError, match="failed"):
        torchrun(1, "-m", "helpers.patched_run", "3", "if calls[0] == 2: time.sleep(6)", env=env)
    assert "Timeout" in stacks.read_text()
