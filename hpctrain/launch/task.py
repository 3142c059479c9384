"""Per-task shim started by srun: set torch.distributed's variables from Slurm's, run the entry point, and
journal it when the entry point is the first of its job step to fail (its node may be bad: hpctrain.launch.nodes).
Not blamed: a rank the watchdog ends as hung, one that fails after a hang was decided in its step (its peer was
killed: hpctrain.runtime.blame), and one that ends after the shim got a signal (srun ending the step after another
rank's failure, a preemption, a cancel).

    srun python -m hpctrain.launch.task -- python train.py ...
    srun python -m hpctrain.launch.task --single -- python train.py ...   (a step of one task: only the watch)

The entry point runs as the shim's child and dies with it; a stop signal the shim gets is passed on (Slurm
signals every process of a step: the child may see it twice). In an hpctrain job the shim also watches its
rank (hpctrain.launch.rankwatch): one stopped past its heartbeat's deadline writes its stacks and is killed, one
its watchdog cannot end is killed, and under `[hang] output_s` rank 0's ends when the job's log goes quiet (every
rank's Python prints unbuffered then, unless `[hang] buffered_output`). The shim ends as its child did: the same
exit code, or killed by the same signal, so srun reports the task as before (HUNG_EXIT for a rank it killed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hpctrain.contract import HEARTBEAT_ENV, JobEnvironment
from hpctrain.errors import HpctrainError
from hpctrain.launch.rankwatch import RankWatch
from hpctrain.launch.rendezvous import task_env
from hpctrain.ledger.journal import Journal
from hpctrain.runtime import blame, heartbeat
from hpctrain.runtime.parent import die_with_parent
from hpctrain.runtime.utilization import NodeSampling
from hpctrain.runtime.watchdog import HUNG_EXIT, job_hang_timeouts, stacks_file

PASSED_ON = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT)


def report_first_failure(status: int) -> None:
    """Journal a ``rank_failed`` record if no other rank of this job step failed before and the step did not hang
    (one per step: srun's --kill-on-bad-exit kills the others only after this task has ended)."""
    env, journal = JobEnvironment(), Journal.from_env()
    if journal is None or not blame.claim(blame.FAILED, env):
        return
    how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit {status}"
    journal.write(
        "rank_failed",
        exit_code=status,
        message=f"rank {env.rank} on {env.node}: {how}, the first of its job step to fail",
    )


def quiet_output(env: JobEnvironment) -> None:
    """A rank of a job whose log is watched (`[hang] output_s`): its Python entry point writes its stacks to the log
    on SIGABRT, and prints unbuffered unless `[hang] buffered_output` says not (block-buffered, a healthy loop's
    prints reach the log 8 KiB at a time: a quiet log, and the lines still buffered lost when it is killed)."""
    os.environ["PYTHONFAULTHANDLER"] = "1"
    if not job_hang_timeouts(env).buffered_output:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")


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
        if env.hang_output_s:
            quiet_output(env)
        quiet_s = env.hang_output_s if env.rank == 0 else 0.0  # the log is the job's: rank 0 watches it
        child = subprocess.Popen(command, preexec_fn=die_with_parent)
    except (HpctrainError, OSError) as exc:
        sys.exit(f"hpctrain: error: {command[0]}: {exc}")
    for signum in list(signalled):  # came before the child was there to pass it to
        child.send_signal(signum)
    # One sampler per node: the shim of its local rank 0, for the GPUs the step has there.
    sampling, journal = None, Journal.from_env()
    if not single and journal is not None and env.job_id is not None and env.local_rank == 0 and env.gpu_ids:
        sampling = NodeSampling(env, journal)
    watch = None
    if beat is not None:
        dump = stacks_file(env, stopped=True)
        log = env.output() if quiet_s else None
        # A rank stopped under output_s is ended by its own shim, before rank 0's finds the log quiet: named, its stacks
        # in the log.
        watch = RankWatch(child, beat, stacks_file(env), dump, env.rank, log, quiet_s, env.hang_output_s / 2)
    status = child.wait()
    if sampling is not None:
        sampling.stop()
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
