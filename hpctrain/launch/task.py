"""Per-task shim started by srun: set torch.distributed's variables from Slurm's, run the entry point, and
journal it when the entry point is the first of its job step to fail (its node may be bad: hpctrain.launch.nodes).
Not blamed: a rank the watchdog ends as hung (every rank of a hung step times out), and one that ends after the
shim got a signal (srun ending the step after another rank's failure, a preemption, a cancel).

    srun python -m hpctrain.launch.task -- python train.py ...
    srun python -m hpctrain.launch.task --single -- python train.py ...   (a step of one task: only the watch)

The entry point runs as the shim's child and dies with it; a stop signal the shim gets is passed on (Slurm
signals every process of a step: the child may see it twice). In an hpctrain job the shim also watches its
rank (hpctrain.launch.rankwatch): one stopped past its heartbeat's deadline writes its stacks and is killed, one
its watchdog cannot end is killed, and under `[hang] output_s` rank 0's ends when the job's log goes quiet. The shim ends as its child did: the same exit code, or killed by
the same signal, so srun reports the task as before (HUNG_EXIT for a rank it killed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hpctrain.contract import HEARTBEAT_ENV, JobEnvironment, JobPaths
from hpctrain.errors import HpctrainError
from hpctrain.launch.rankwatch import RankWatch
from hpctrain.launch.rendezvous import task_env
from hpctrain.ledger.journal import Journal
from hpctrain.runtime import heartbeat
from hpctrain.runtime.parent import die_with_parent
from hpctrain.runtime.watchdog import HUNG_EXIT, stacks_file

PASSED_ON = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT)


def report_first_failure(status: int) -> None:
    """Journal a ``rank_failed`` record if no other rank of this job step failed before (one per step:
    srun's --kill-on-bad-exit kills the others only after this task has ended)."""
    env, journal = JobEnvironment(), Journal.from_env()
    if journal is None or env.job_dir is None or not env.in_slurm:
        return
    marker = JobPaths(env.job_dir).first_failure(env.step_id)
    try:
        marker.parent.mkdir(exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return
    how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit {status}"
    journal.write(
        "rank_failed",
        exit_code=status,
        message=f"rank {env.rank} on {env.node}: {how}, the first of its job step to fail",
    )


def main(argv: list[str]) -> None:
    single = argv[:1] == ["--single"]
    argv = argv[single:]
    command = argv[1:] if argv and argv[0] == "--" else argv
    if not command:
        sys.exit("hpctrain: error: hpctrain.launch.task: no command given")
    beat, child = None, None
    signalled: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        signalled.append(signum)
        if child is not None:
            child.send_signal(signum)

    # Before the entry point starts: a signal that comes while it starts is passed on once it runs, not taken by
    # the default action (which would end the shim, and with it the entry point, as if killed by it).
    for sig in PASSED_ON:
        signal.signal(sig, pass_on)
    try:
        if not single:
            os.environ.update(task_env(os.environ))
        env = JobEnvironment()
        if env.job_dir is not None:
            beat, os.environ[HEARTBEAT_ENV] = heartbeat.create()
        quiet_s = env.hang_output_s if env.rank == 0 else 0.0  # the log is the job's: rank 0 watches it
        if quiet_s:
            os.environ["PYTHONFAULTHANDLER"] = "1"  # a Python entry point's stacks go to the log on SIGABRT
        child = subprocess.Popen(command, preexec_fn=die_with_parent)
    except (HpctrainError, OSError) as exc:
        sys.exit(f"hpctrain: error: {command[0]}: {exc}")
    for signum in list(signalled):  # came before the child was there to pass it to
        child.send_signal(signum)
    watch = None
    if beat is not None:
        dump = stacks_file(env, stopped=True)
        watch = RankWatch(child, beat, stacks_file(env), dump, env.rank, env.output() if quiet_s else None, quiet_s)
    status = child.wait()
    if watch and watch.hung:
        status = HUNG_EXIT
    # A rank that ends after a signal was stopped (srun ending the step, preemption, scancel): not its node's fault.
    if status not in (0, HUNG_EXIT) and not signalled and not single:
        report_first_failure(status)
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status  # the signal's default action does not end a process (SIGCHLD, SIGURG...)
    sys.exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
