"""The node's GPU sampler (issue 61): NVML through the real binding where it can read, the processes of the local
ranks where it cannot (this machine has no driver), the summaries and the timeline it journals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pynvml
import pytest

from hpctrain.config.policies import IdlePolicy
from hpctrain.contract import JOB_DIR_ENV, SPEC_ENV, JobEnvironment
from hpctrain.interactive.spec import session_spec
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.idle_cancel import IdleCancel
from hpctrain.runtime.utilization import (
    GpuSummary,
    NodeSampler,
    NvmlSource,
    ProcessSource,
    Reading,
    idle_end,
    job_idle_policy,
    open_source,
)

from helpers.waiting import wait_until


def test_without_a_driver_nvml_says_why_and_the_processes_are_read():
    source, why = open_source(["0", "1"])
    assert isinstance(source, ProcessSource) and source.kind == "cpu" and source.devices == ["0", "1"]
    assert why is not None and why.startswith("NVML: ")


def test_without_the_binding_the_processes_are_read(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    source, why = open_source(["3"])
    assert source.kind == "cpu" and why == "nvidia-ml-py is not installed"


def test_a_reading_nvml_refuses_is_missing_not_a_failure():
    """The binding's own calls, on a handle NVML cannot read (here: no library loaded): NVMLError, caught."""
    source = NvmlSource.__new__(NvmlSource)
    source.nvml, source.handles, source.devices = pynvml, [None], ["0"]
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlDeviceGetUtilizationRates(None)
    assert source.read() == [Reading(None)]


BUSY = "import time\nend = time.time() + 300\nwhile time.time() < end: pass"
IDLE = "import time; time.sleep(300)"


def test_each_local_ranks_processes_stand_for_its_gpu():
    """Two 'shims' (children of this process, as tasks are of their slurmstepd) with SLURM_LOCALID 0 and 1, each
    running a Python of its own: rank 0's spins, rank 1's sleeps; the shims themselves are not counted. Rank 0's
    reading holds at least the CPU time its process was seen to use meanwhile, whatever else the machine runs."""
    shims = [
        subprocess.Popen(["sh", "-c", f'"$0" -c "$1"; true', sys.executable, code],
                         env={**os.environ, "SLURM_LOCALID": str(rank)}, start_new_session=True)
        for rank, code in ((0, BUSY), (1, IDLE))
    ]
    try:
        source = ProcessSource(["4", "5"], step_pid=os.getpid())
        deadline, first = time.time() + 10, {}
        while len(first) < 2 and time.time() < deadline:  # a loaded machine may find one shim a reading before
            readings = source.read()
            first.update({rank: readings[rank].util for rank in source.shims if rank not in first})
            time.sleep(0.1)
        assert first == {0: None, 1: None}  # each rank's first reading is the baseline of its CPU time
        [spinner] = wait_until(lambda: psutil.Process(shims[0].pid).children(), timeout=30)
        started = time.monotonic()
        source.read()  # the window starts: rank 0's CPU time from here on
        spun = spinner.cpu_times()
        wait_until(lambda: sum(spinner.cpu_times()[:2]) - sum(spun[:2]) >= 0.5, timeout=120)
        spent = sum(spinner.cpu_times()[:2]) - sum(spun[:2])
        busy, idle = source.read()
        window = time.monotonic() - started  # at least the reading's own window
        assert source.shims == {0: shims[0].pid, 1: shims[1].pid}
        assert busy.util is not None and busy.util / 100 * window >= spent * 0.95, (busy, window, spent)
        assert idle.util is not None and idle.util < 5, idle
        assert busy.mem_used and idle.mem_used and busy.mem_total
    finally:
        for shim in shims:  # and its rank's process: a group of its own
            os.killpg(shim.pid, signal.SIGKILL)
            shim.wait()


def test_a_gpu_counts_idle_once_it_stays_idle_long_enough():
    gpu = GpuSummary()
    at = 1_000_020.0
    for util in [90, 90, 0, 0, 0, 90, 0, 0, 0, 0, 0, 0]:  # 10 s each; idle after 30 s
        gpu.add(Reading(util, 1e9, 8e9, 100.0), 10.0, at, below=5, after_s=30)
        at += 10
    rec = gpu.record()
    assert rec["seconds"] == 120 and rec["samples"] == 12
    assert rec["idle_s"] == 90 and rec["idle_now_s"] == 60  # 3 idle readings (30 s), then 6 (60 s)
    assert rec["mean"] == 22.5 and rec["p10"] == 0 and rec["energy_j"] == 12000 and rec["mem_peak"] == 1e9
    assert GpuSummary().record()["mean"] is None


def test_the_timeline_has_a_point_per_minute_finished():
    gpu = GpuSummary()
    points = [gpu.add(Reading(util, mem, 8.0), 20.0, at, 5, 60) for at, util, mem in
              [(60, 10, 1.0), (80, 20, 3.0), (100, 30, 2.0), (120, 100, 1.0), (140, 100, 1.0)]]
    assert points == [None, None, None, (60, 20.0, 3.0), None]
    assert gpu.close_minute() == (120, 100.0, 1.0) and gpu.close_minute() is None


class Fake:
    kind, devices = "cpu", ["0", "1"]

    def __init__(self):
        self.closed = False

    def read(self):
        return [Reading(80.0, 1.0, 2.0), Reading(0.0, 1.0, 2.0)]

    def close(self):
        self.closed = True


def test_the_sampler_journals_summaries_and_a_last_record_when_stopped():
    written: list[dict] = []
    source = Fake()
    sampler = NodeSampler(source, written.append, sample_s=0.05, below_percent=5, after_minutes=0, alert_minutes=2,
                          why="NVML: no")
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    last = written[-1]
    assert last["final"] and last["source"] == "cpu" and last["why"] == "NVML: no" and source.closed
    assert last["policy"] == {"below_percent": 5, "after_s": 0, "alert_s": 120}
    assert last["gpus"]["0"]["mean"] == 80 and last["gpus"]["1"]["mean"] == 0
    assert last["gpus"]["1"]["idle_s"] == last["gpus"]["1"]["seconds"] > 0
    assert {p[1] for p in last["timeline"]} == {"0", "1"} and last["cost_s"] >= 0


def test_what_ends_a_node_idle_the_policys_cancel_and_a_sessions_idle_minutes_under_nvml(tmp_path, monkeypatch):
    """A session's kernels may keep busy on the CPU alone: where NVML reads its GPUs, their idleness ends it after
    its idle_minutes; read from the processes, a GPU is as busy as its kernels, which Jupyter's culling ends."""
    session = session_spec(idle_minutes=30)
    spec = tmp_path / "spec.json"
    spec.write_text(session.model_dump_json(by_alias=True), encoding="utf-8")
    monkeypatch.delenv("HPCTRAIN_SITE", raising=False)
    policy, found = job_idle_policy(JobEnvironment({SPEC_ENV: str(spec)}))
    assert found == session.interactive and policy.action == "alert"
    assert idle_end(policy, found, "cpu") is None
    assert idle_end(policy, found, "nvml") == (1800.0, "the session's idle_minutes = 30")
    cancel = IdlePolicy(action="cancel", cancel_minutes=10).resolved()
    by_policy = (600.0, '[idle] action = "cancel", cancel_minutes = 10')
    assert idle_end(cancel, found, "nvml") == idle_end(cancel, found, "cpu") == idle_end(cancel, None, "cpu") == by_policy
    assert idle_end(IdlePolicy(action="cancel", cancel_minutes=45).resolved(), found, "nvml")[0] == 1800.0
    assert idle_end(IdlePolicy().resolved(), None, "nvml") is None


class IdleNvml(Fake):
    kind = "nvml"

    def read(self):
        return [Reading(0.0, 1.0, 2.0), Reading(1.0, 1.0, 2.0)]


def test_a_session_whose_nvml_gpus_stay_idle_is_ended_once_as_idle(tmp_path):
    """The node's sampler, given what `idle_end` says of a session under NVML: the run's end is journaled once,
    cause idle, naming the session's setting, and Slurm is asked to end it."""
    (tmp_path / "job").mkdir()
    env = JobEnvironment({JOB_DIR_ENV: str(tmp_path / "job"), "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1",
                          "SLURM_RESTART_COUNT": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_PROCID": "0"})
    journal, cancelled = Journal(tmp_path / "journal.jsonl"), []
    end = idle_end(IdlePolicy().resolved(), session_spec(idle_minutes=0.005).interactive, "nvml")
    assert end is not None
    sampler = NodeSampler(IdleNvml(), lambda record: None, sample_s=0.05, below_percent=5, after_minutes=1,
                          alert_minutes=2, idle_cancel=IdleCancel(env, *end, journal, cancelled.append))
    sampler.start()
    wait_until(lambda: sampler.cancelled, timeout=30, what="the session ended")
    sampler.stop()
    (decided,) = [rec for _, rec in journal.records(kinds=("idle_cancel",))]
    assert decided["cause"] == "idle" and not decided["requeued"] and cancelled == ["77"]
    assert "the session's idle_minutes = 0.005" in decided["message"]
