#!/bin/bash
# Rendered by hpctrain 0.1.0 for job dist (ledger id 42). Do not edit: resubmit instead.
#SBATCH --job-name=dist
#SBATCH --partition=gpu
#SBATCH --account=teama
#SBATCH --qos=normal
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --gpus-per-node=2
#SBATCH --mem=1024M
#SBATCH --time=00:05:00
#SBATCH --output=/shared/logs/job-42/slurm-%j.out
#SBATCH --comment=hpctrain:job-42:42
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR2@60
#SBATCH --export=ALL

set -eo pipefail
# The Python environment hpctrain runs in (site launch.python, else the one that submitted) comes first.
export PATH=/opt/hpctrain/bin:"$PATH"
export HPCTRAIN_JOB_ID=42
export HPCTRAIN_SITE=/etc/hpctrain/sites/dev.toml
export HPCTRAIN_JOB_DIR=/shared/logs/job-42
export HPCTRAIN_JOURNAL_DIR=/shared/logs/job-42/journal
export HPCTRAIN_SPEC=/shared/logs/job-42/spec.json
export HPCTRAIN_SCRIPT=/shared/logs/job-42/job.sh
export HPCTRAIN_SIGNAL_LEAD_S=60
export HPCTRAIN_SEED=0
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1
set +e

# The --signal notice (USR2) reaches only this shell, and a stop signal may be sent to it alone
# (scancel --batch): pass every one on to the job step so training can checkpoint. Under srun it goes
# on as USR2, the notice: srun answers SIGTERM and SIGHUP by SIGKILLing its tasks. (Preemption,
# time limits and scancel signal the step's tasks themselves as well.)
# Each stop signal is also written down for the trainer's guard (hpctrain.runtime.PreemptionGuard):
# one that reaches srun before it has started its tasks can be lost.
export HPCTRAIN_NOTICE_FILE="$HPCTRAIN_JOB_DIR/notice-$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"
step_pid=
stop_signal=
notice=USR2
forward() {
  echo "hpctrain: batch shell got SIG$1 at $(date +%s); passing SIG${notice:-$1} to the job step" >&2
  stop_signal=$1
  echo "$1" > "$HPCTRAIN_NOTICE_FILE" 2>/dev/null
  [ -n "$step_pid" ] && kill -s "${notice:-$1}" "$step_pid" 2>/dev/null
}
trap 'forward USR2' USR2
trap 'forward TERM' TERM
trap 'forward HUP' HUP

# This run's number, journaled with the checkpoint step it starts from; exit 3: past the requeue cap; 4: the job's
# work is done (a run Slurm started on its own after one completed it). The bookkeeping runs with the stop signals
# ignored: Slurm signals every process of the job.
HPCTRAIN_ATTEMPT=$(trap '' TERM USR2 HUP; exec /opt/hpctrain/bin/python -m hpctrain attempt start)
case $? in
  0) export HPCTRAIN_ATTEMPT ;;
  3) exit 3 ;;
  4) exit 0 ;;
  *) echo "hpctrain: could not record this run's start; running anyway" >&2 ;;
esac

# One task per GPU (per slot on CPU nodes): `hpctrain launch` sets MASTER_ADDR (first node),
# a MASTER_PORT derived from the job id, the site's NCCL/InfiniBand settings, and each task's
# RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE from Slurm's ids, then execs srun.
/opt/hpctrain/bin/python -m hpctrain launch -- python -c 'import os; print('"'"'rank'"'"', os.environ['"'"'RANK'"'"'], '"'"'of'"'"', os.environ['"'"'WORLD_SIZE'"'"'], os.environ['"'"'MASTER_ADDR'"'"'])' &
step_pid=$!
# A notice that came before the step existed is passed on now.
[ -n "$stop_signal" ] && kill -s "${notice:-$stop_signal}" "$step_pid" 2>/dev/null
# wait returns early whenever a trapped signal arrives: keep waiting until the step has exited.
while :; do
  wait "$step_pid"
  rc=$?
  kill -0 "$step_pid" 2>/dev/null || break
done
# Journal how the run ended; requeue it (or only this array task) when the spec's retry policy says so.
(trap '' TERM USR2 HUP; exec /opt/hpctrain/bin/python -m hpctrain attempt end --exit-code "$rc" ${stop_signal:+--signal "$stop_signal"})
exit $rc
