"""The reference trainer's save steps (hpctrain.train.saves): fixed, every N minutes in steps of the measured step
time, or "auto" from measured saves and interruptions; each new interval journaled with why. One process: the
reductions over ranks are the values themselves."""

import json
import time
from concurrent.futures import Future

import pytest

from hpctrain.checkpoint.interval import InterruptionRate, choose_interval
from hpctrain.checkpoint.naming import list_dirs
from hpctrain.config.job import CheckpointPolicy, load_job_spec
from hpctrain.config.site import Alerts
from hpctrain.jobs.alerts import job_alerts
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.table import Table
from hpctrain.errors import ConfigError
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.attempts import interruption_history
from hpctrain.train.saves import WARMUP_STEPS, SaveSchedule, earlier_measurements

from helpers.paths import REPO
from helpers.train import TINY_MODEL, pack_text_dataset, torchrun, trainer_spec


def done_future() -> Future:
    future = Future()
    future.set_result(None)
    return future


def run(schedule: SaveSchedule, start: int, steps: int, step_s: float, blocked_s: float = 0.0) -> list[int]:
    """Steps ``start + 1 .. start + steps`` of ``step_s`` each: the steps saved at."""
    schedule.begin(start)
    saved = []
    for step in range(start + 1, start + steps + 1):
        schedule.step_done(step_s)
        if schedule.due(step):
            saved.append(step)
            schedule.saved(step, blocked_s, done_future())
        schedule.choose(step)
    return saved


def test_fixed_steps_save_on_their_multiples():
    assert run(SaveSchedule(CheckpointPolicy(every_steps=7)), 3, 20, 0.1) == [7, 14, 21]


def test_minutes_are_steps_of_the_measured_step_time_from_the_warmup_on(tmp_path):
    journal = Journal(tmp_path)
    schedule = SaveSchedule(CheckpointPolicy(every_minutes=0.5), journal=journal)  # 30 s: 60 steps of 0.5 s
    assert run(schedule, 100, 200, 0.5) == [100 + WARMUP_STEPS + 60, 100 + WARMUP_STEPS + 120,
                                            100 + WARMUP_STEPS + 180]
    (chosen,) = [r for _, r in journal.records(kinds=["checkpoint_interval"])]  # the same each time: journaled once
    assert (chosen["step"], chosen["steps"]) == (100 + WARMUP_STEPS, 60)
    assert chosen["message"] == "checkpoints every 60 steps: 0.5 minutes at 0.500 s a step"


def test_auto_saves_at_the_warmup_then_at_dalys_interval_for_the_measured_save(tmp_path):
    journal = Journal(tmp_path)
    schedule = SaveSchedule(CheckpointPolicy(every_steps="auto"), history=(3, 3 * 3600.0), prior_mtbi_s=3600,
                            journal=journal)
    saved = run(schedule, 0, 400, step_s=0.5, blocked_s=0.2)
    expected = choose_interval(0.2, 0.0, 0.5, InterruptionRate(3, 3 * 3600.0, prior_s=3600))
    assert 60 < expected.steps < 200  # about 34 s at one interruption an hour
    assert saved[:3] == [WARMUP_STEPS, WARMUP_STEPS + expected.steps, WARMUP_STEPS + 2 * expected.steps]
    first = next(r for _, r in journal.records(kinds=["checkpoint_interval"]))
    assert first["steps"] == expected.steps and first["mtbi_s"] == pytest.approx(3600, rel=0.01)
    assert first["message"].startswith(f"checkpoints every {expected.steps} steps (")
    assert "interruptions that lose work one every 1.00 h (3 in 3.0 h seen" in first["message"]


def test_a_restart_goes_on_from_the_journaled_measurements_without_a_warmup_save(tmp_path):
    """Issue 56's real run: each of 18 restarts in place began with a save at its warm-up, 13 saves more than the
    best fixed interval made; an earlier start's measured save, commit and step times now stand in for it."""
    journal = Journal(tmp_path)
    first = SaveSchedule(CheckpointPolicy(every_steps="auto"), history=(3, 3 * 3600.0), prior_mtbi_s=3600,
                         journal=journal)
    first_saves = run(first, 0, 100, step_s=0.5, blocked_s=0.2)
    assert first_saves[0] == WARMUP_STEPS
    measured = earlier_measurements(journal, -1, memory=False)
    assert measured == pytest.approx((0.2, 0.2, 0.5), abs=0.01)  # a save blocks its whole commit here
    assert earlier_measurements(journal, -1, memory=True) is None and earlier_measurements(journal, 3, False) is None
    restarted = SaveSchedule(CheckpointPolicy(every_steps="auto"), history=(4, 3 * 3600.0), prior_mtbi_s=3600,
                             measured=measured)
    expected = choose_interval(*measured, InterruptionRate(4, 3 * 3600.0, prior_s=3600))
    assert run(restarted, 100, 400, step_s=0.5, blocked_s=0.2)[:2] == [
        100 + WARMUP_STEPS + expected.steps, 100 + WARMUP_STEPS + 2 * expected.steps]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def slowing_saves(journal: Journal, slow_factor: float) -> list[int]:
    """300 steps of 0.5 s under "auto": commits of 1 s, from the sixth save on of 10 s; the steps saved at."""
    clock = Clock()
    schedule = SaveSchedule(CheckpointPolicy(every_steps="auto"), prior_mtbi_s=60, journal=journal,
                            slow_factor=slow_factor, clock=clock)
    schedule.begin(0)
    saved, pending = [], []
    for step in range(1, 301):
        clock.now += 0.5
        for future, done_at in [p for p in pending if p[1] <= clock.now]:
            future.set_result(None)
            pending.remove((future, done_at))
        schedule.step_done(0.5)
        if schedule.due(step):
            saved.append(step)
            future = Future()
            schedule.saved(step, 0.2, future)
            pending.append((future, clock.now + (1.0 if len(saved) <= 5 else 10.0)))
        schedule.choose(step)
    return saved


def test_a_commit_ten_times_slower_is_an_event_and_auto_waits_for_it(tmp_path):
    """Commits of 1 s, then of 10 s (the checkpoint file system slowed down): the first slow one is journaled as such,
    and "auto" lengthens its interval to at least a commit, saying so. The site's factor decides what is slow."""
    journal = Journal(tmp_path / "factor-5")
    saved = slowing_saves(journal, slow_factor=5)
    (slow,) = [r for _, r in journal.records(kinds=["slow_save"])][:1]
    assert slow["step"] == saved[5] and slow["seconds"] == pytest.approx(10.2) and slow["usual_s"] == pytest.approx(1.2)
    assert slow["message"] == (f"the checkpoint of step {saved[5]} took 10.2 s to commit, 8x the median of the 5 "
                               'before (1.2 s): the checkpoint file system is slow; "auto" waits for it')
    gaps = [b - a for a, b in zip(saved, saved[1:])]
    assert max(gaps[:4]) * 0.5 < 10.2 <= min(gaps[-3:]) * 0.5  # the interval: shorter than a slow commit, then not
    chosen = [r for _, r in journal.records(kinds=["checkpoint_interval"])]
    assert "commits in 10.2 s" in chosen[-1]["message"] and chosen[-1]["steps"] >= 21
    lenient = Journal(tmp_path / "factor-10")
    assert slowing_saves(lenient, slow_factor=10) == saved  # "auto" waits all the same
    assert list(lenient.records(kinds=["slow_save"])) == []  # 8.5x is not slow to a site that says 10x


def test_interruptions_are_the_runs_that_lost_work_and_the_steps_restarted_in_place(tmp_path):
    journal = Journal(tmp_path)
    for attempt, start, end, cause in [(0, 1000.0, 4600.0, "preemption"), (1, 4700.0, 8300.0, "timeout"),
                                       (2, 8400.0, 9400.0, "node_failure")]:
        journal.write("attempt_start", attempt=attempt, time=start)
        journal.write("attempt_end", attempt=attempt, time=end, cause=cause)
    journal.write("step_restart", attempt=3, time=9600.0)
    journal.write("attempt_start", attempt=3, time=9500.0, task_index=2)  # another array task's
    # the preemption's notice saved and the time limit's: the node failure and the step restarted in place lost work
    assert interruption_history(journal, -1) == (2, 3600.0 + 3600.0 + 1000.0)
    assert interruption_history(journal, -1, in_place_only=True) == (1, 3600.0 + 3600.0 + 1000.0)


def test_the_memory_tiers_auto_has_a_schedule_of_its_own(tmp_path):
    """memory_every_steps = "auto" beside a fixed file-system interval: the memory tier saves at the warm-up's end,
    then at Daly's interval for its own measured save and its interruptions, journaled as the memory tier's."""
    journal = Journal(tmp_path)
    policy = CheckpointPolicy(every_steps=500, memory_every_steps="auto")
    memory = SaveSchedule(policy, history=(2, 7200.0), prior_mtbi_s=3600, journal=journal, memory=True)
    saved = run(memory, 0, 400, step_s=0.5, blocked_s=0.02)
    expected = choose_interval(0.02, 0.0, 0.5, InterruptionRate(2, 7200.0, prior_s=3600))
    assert saved[:3] == [WARMUP_STEPS, WARMUP_STEPS + expected.steps, WARMUP_STEPS + 2 * expected.steps]
    (chosen,) = [r for _, r in journal.records(kinds=["checkpoint_interval"])]
    assert (chosen["tier"], chosen["steps"]) == ("memory", expected.steps)
    assert chosen["message"].startswith(f"memory-tier checkpoints every {expected.steps} steps (")
    assert run(SaveSchedule(policy), 0, 1000, step_s=0.5) == [500, 1000]  # the file system's: fixed


def test_a_spec_gives_every_steps_or_every_minutes_not_both(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "j"\ncommand = ["true"]\n[checkpoint]\nevery_steps = "auto"\nevery_minutes = 5\n')
    with pytest.raises(ConfigError, match="checkpoint.every_minutes: give every_steps or every_minutes, not both"):
        load_job_spec(spec)
    spec.write_text('name = "j"\ncommand = ["true"]\n[checkpoint]\nevery_minutes = "auto"\n')
    assert load_job_spec(spec).checkpoint.every_minutes == "auto"
    spec.write_text('name = "j"\ncommand = ["true"]\n[checkpoint]\nevery_steps = "often"\n')
    with pytest.raises(ConfigError, match="every_steps"):
        load_job_spec(spec)


def test_the_trainer_saves_where_auto_chose_and_journals_why(tmp_path):
    """2 ranks, every_steps = "auto": the first save at the warm-up's end, the next one Daly's interval later (the
    site's prior of one interruption a day, and the 10 in 10 hours the ledger had of jobs alike at submit: one in
    1.2 h, far past this run's end), the choice journaled once."""
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=100, shard_bytes=4096).path
    spec = tmp_path / "auto.toml"
    spec.write_text(trainer_spec("gpt-auto", seed=3, index=index, ckpt=tmp_path / "ck", every_steps='"auto"',
                                 resources={"gpus_per_node": 2}, parallel="tp = 2"))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "interruptions.json").write_text('{"events": 10, "exposure_s": 36000, "like": "gpu, low, 2 GPUs"}')
    out = torchrun(2, "-m", "hpctrain.train", "--spec", str(spec), "--steps", str(WARMUP_STEPS + 5),
                   env={"HPCTRAIN_JOURNAL_DIR": str(tmp_path / "journal"), "HPCTRAIN_JOB_ID": "1",
                        "HPCTRAIN_JOB_DIR": str(job_dir)})
    assert [json.loads(ln)["step"] for ln in out.stdout.splitlines() if ln.startswith("{")] == list(
        range(1, WARMUP_STEPS + 6))
    assert [d.step for d in list_dirs(tmp_path / "ck")] == [WARMUP_STEPS]
    (chosen,) = [r for _, r in Journal(tmp_path / "journal").records(kinds=["checkpoint_interval"])]
    assert chosen["step"] == WARMUP_STEPS and chosen["steps"] > 5
    # (the prior's day weighted 1/11, the ledger's 10 hours, and this run's seconds) over (1/11 + 10) interruptions
    assert (86400 / 11 + 36000) / (1 / 11 + 10) < chosen["mtbi_s"] < (86400 / 11 + 36000 + 600) / (1 / 11 + 10)
    assert "interruptions that lose work one every 1.21 h (10 in 10.0 h seen, prior one in 24 h)" in chosen["message"]


def test_the_trainers_memory_tier_saves_where_its_auto_chose(tmp_path):
    """2 ranks, memory_every_steps = "auto" under the site's prior of one failure in 36 s (restarts in place), the
    file system every 1000 steps: the memory tier's interval is chosen at the warm-up's end from its own saves and
    journaled with the site's failure prior, not the preemptible one; the file system saves nothing, and the run
    frees its memory at the end."""
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=100, shard_bytes=4096).path
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text().replace(
        "[checkpoint]\n", f'[checkpoint]\nmtbi_hours = 0.01\nmemory_dir = "{tmp_path / "shm"}"\n'))
    spec = tmp_path / "auto.toml"
    spec.write_text(trainer_spec("gpt-memory-auto", seed=3, index=index, ckpt=tmp_path / "ck", every_steps=1000,
                                 resources={"gpus_per_node": 2, "preemptible": True}, parallel="tp = 2")
                    + 'memory_every_steps = "auto"\n[retry]\nin_place = 1\n')
    torchrun(2, "-m", "hpctrain.train", "--spec", str(spec), "--steps", str(WARMUP_STEPS + 5),
             env={"HPCTRAIN_JOURNAL_DIR": str(tmp_path / "journal"), "HPCTRAIN_JOB_ID": "1", "HPCTRAIN_SITE": str(site)})
    # a later choice is journaled too where the measurements moved by more than CHANGE (a loaded machine's steps)
    chosen, *later = [r for _, r in Journal(tmp_path / "journal").records(kinds=["checkpoint_interval"])]
    assert (chosen["tier"], chosen["step"]) == ("memory", WARMUP_STEPS) and chosen["steps"] >= 1
    assert all(r["tier"] == "memory" and r["step"] > WARMUP_STEPS for r in later), later
    assert 36 <= chosen["mtbi_s"] < 36 + 600 and "prior one in 0.01 h" in chosen["message"]
    assert chosen["cost_s"] > 0  # the memory tier's save at the warm-up's end, measured
    assert list_dirs(tmp_path / "ck") == [] and list((tmp_path / "shm").iterdir()) == []


def test_saves_ten_times_slower_mid_run_raise_the_alert_and_lengthen_autos_interval(tmp_path):
    """The trainer on 2 ranks, every_steps = "auto" under a site prior of one interruption in 7 s (saves a few steps
    apart); from its fifth save on the checkpoint directory takes 8 s more per save (a commit here: about 1 s). The
    first slow commit is journaled, "auto" then chooses intervals at least a commit long and says why, and `status`
    flags the job once its journal is in the ledger."""
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=100, shard_bytes=4096).path
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text().replace("[checkpoint]\n",
                                                                            "[checkpoint]\nmtbi_hours = 0.002\n"))
    spec = tmp_path / "auto.toml"
    spec.write_text(trainer_spec("gpt-slow-disk", seed=3, index=index, ckpt=tmp_path / "ck", every_steps='"auto"',
                                 resources={"gpus_per_node": 2}, parallel="tp = 2"))
    torchrun(2, "-m", "helpers.slow_saves", "4", "8", "--spec", str(spec), "--steps", "120",
             env={"HPCTRAIN_JOURNAL_DIR": str(tmp_path / "journal"), "HPCTRAIN_JOB_ID": "1", "HPCTRAIN_SITE": str(site)})
    journal = Journal(tmp_path / "journal")
    saved = [r["step"] for _, r in journal.records(kinds=["checkpoint"]) if r.get("state") == "committed"]
    (slow, *_) = [r for _, r in journal.records(kinds=["slow_save"])]
    assert slow["step"] == saved[4] and slow["seconds"] >= 8 and slow["seconds"] > 5 * slow["usual_s"], saved
    chosen = [r for _, r in journal.records(kinds=["checkpoint_interval"])]
    early = [c for c in chosen if c["step"] < slow["step"]]
    late = [c for c in chosen if c["time"] > slow["time"]]
    assert early and all(c["commit_s"] < 8 for c in early)
    assert late and all(c["seconds"] >= c["commit_s"] >= 8 for c in late), late
    assert f"commits in {late[0]['commit_s']:.1f} s" in late[0]["message"]
    with Ledger(tmp_path / "ledger.db") as ledger:
        job = ledger.jobs.get(Table(ledger, "jobs").insert({"name": "gpt-slow-disk", "site": "dev", "state": "RUNNING"}))
        ingest_journal(ledger, journal)
        alerts = job_alerts(ledger, [job], Alerts(), now=time.time())
    assert any(a.startswith("slow saves: step ") for a in alerts.get(job["id"], [])), alerts
