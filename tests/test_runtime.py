"""The in-job guard and requeue target, in one process (the cluster tests cover real preemption)."""

import os
import signal
import time

from hpctrain.runtime import PreemptionGuard, requeue_target


def test_signals_set_the_stop_flag_and_cause_follows_remaining_time():
    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP):
        guard = PreemptionGuard(end_time=lambda: time.time() + 3600, timeout_margin_s=120)
        try:
            assert not guard.should_stop()
            os.kill(os.getpid(), sig)
            assert guard.should_stop() and guard.signal == sig
            assert guard.cause() == "preemption"
            guard.end_time = lambda: time.time() + 60
            assert guard.cause() == "timeout"
        finally:
            guard.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_usr1_is_left_alone():
    guard = PreemptionGuard()
    try:
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        guard.uninstall()


def test_requeue_targets_the_array_task_not_the_array():
    assert requeue_target({"SLURM_JOB_ID": "812", "SLURM_ARRAY_JOB_ID": "800", "SLURM_ARRAY_TASK_ID": "12"}) == "800_12"
    assert requeue_target({"SLURM_JOB_ID": "812"}) == "812"
