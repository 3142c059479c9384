"""Parsers of Slurm's text output, on output recorded from the dev cluster and a real site."""

import pytest

from hpctrain.slurm.parse import gpus_in_gres, parse_kv_line, parse_parsable

NODE = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUTot=16 CPULoad=0.41 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:4 NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 "
    "OS=Linux 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016 RealMemory=65536 AllocMem=0 FreeMem=21000 "
    "Partitions=gpu,debug State=IDLE ThreadsPerCore=1 CfgTRES=cpu=16,mem=64G,billing=16,gres/gpu=4 "
    "AllocTRES= Reason=maintenance window [root@2026-11-22T03:00:00]"
)


def test_kv_line_keeps_spaces_and_equals_in_values():
    rec = parse_kv_line(NODE)
    assert rec["NodeName"] == "n1"
    assert rec["OS"] == "Linux 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"
    assert rec["CfgTRES"] == "cpu=16,mem=64G,billing=16,gres/gpu=4"
    assert rec["AllocTRES"] == ""
    assert rec["Partitions"] == "gpu,debug"
    assert rec["Reason"] == "maintenance window [root@2026-11-22T03:00:00]"


def test_parsable_rows_by_requested_names():
    out = "normal|||cluster\nlow|0||requeue\nhigh|1000|low|cluster\n"
    rows = parse_parsable(out, ["Name", "Priority", "Preempt", "PreemptMode"])
    assert rows[2] == {"name": "high", "priority": "1000", "preempt": "low", "preemptmode": "cluster"}


def test_gpus_in_gres_forms():
    assert gpus_in_gres("gpu:4") == 4
    assert gpus_in_gres("gpu:h100:8(S:0-1)") == 8
    assert gpus_in_gres("gpu:a100:2,gpu:v100:2") == 4
    assert gpus_in_gres("(null)") == 0
    assert gpus_in_gres("") == 0


@pytest.mark.parametrize("text, version, slurm_requeues, reruns", [
    ("slurm 22.05.8", "22.05.8", False, False), ("24.11.5", "24.11.5", True, True),
    ("slurm 26.05.5\n", "26.05.5", True, False), ("slurm 23.11.0-rc1", "23.11.0", False, False)])
def test_slurm_versions_and_what_they_change(text, version, slurm_requeues, reruns):
    from hpctrain.slurm.version import SlurmVersion

    v = SlurmVersion.parse(text)
    assert str(v) == version and v.requeues_preempted_exit is slurm_requeues
    assert ("leaves it to Slurm" in v.preemption_note()) is slurm_requeues
    assert ("run once more by Slurm" in v.preemption_note()) is reruns


@pytest.mark.parametrize("conf, delay, source, only_state", [
    ({"SLURM_VERSION": "22.05.8", "AuthInfo": "socket=/run/m.sock,cred_expire=10",
      "SchedulerParameters": "requeue_delay=2"}, 10, "AuthInfo cred_expire", False),  # no requeue_delay before 25.11
    ({"SLURM_VERSION": "24.11.5", "AuthInfo": "(null)"}, 120, "AuthInfo cred_expire", True),
    ({"SLURM_VERSION": "26.05.5", "AuthInfo": "cred_expire=10", "SchedulerParameters": "bf_interval=1,requeue_delay=2"},
     2, "SchedulerParameters requeue_delay", True),
    ({"SLURM_VERSION": "26.05.5", "AuthInfo": "cred_expire=30", "SchedulerParameters": "bf_interval=1"},
     30, "AuthInfo cred_expire", True)])
def test_features_come_from_the_release_and_the_controllers_config(conf, delay, source, only_state):
    from hpctrain.slurm.version import SlurmFeatures

    f = SlurmFeatures.from_config(conf)
    assert (f.requeue_delay_s, f.requeue_delay_from, f.version.has_only_job_state) == (delay, source, only_state)
    assert f"waits {delay} s before it may start ({source})" in "; ".join(f.notes())


def test_an_unreadable_slurm_version_is_a_slurm_error():
    from hpctrain.errors import SlurmError
    from hpctrain.slurm.version import SlurmVersion

    with pytest.raises(SlurmError, match="cannot read a Slurm version from 'slurm unknown'"):
        SlurmVersion.parse("slurm unknown")


# `scontrol -o show job` recorded on the 26.05 lane (scripts/slurm-lane): SubmitLine holds the command line.
JOB_26_05 = 'JobId=192 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1666 Nice=0 Account=teama QOS=low JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-11-24T07:00:54 EligibleTime=2026-11-24T07:00:54 AccrueTime=2026-11-24T07:00:54 StartTime=2026-11-24T07:00:54 EndTime=2026-11-24T07:05:54 Deadline=N/A PreemptEligibleTime=2026-11-24T07:00:54 PreemptTime=None SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-24T07:00:54 Scheduler=Backfill Partition=gpu AllocNode:Sid=localhost:1152 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* ReqTRES=cpu=1,mem=1G,node=1,billing=1 AllocTRES=cpu=1,mem=1G,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=1G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Exclusive=NO Contiguous=0 Licenses=(null) LicensesAlloc=(null) Network=(null) Command=(null) SubmitLine=sbatch --parsable --qos=low --account=teama --signal=B:USR2@60 --time=5 --wrap sleep 30 # A=1 B=two words WorkDir=/work/main StdErr= StdIn=/dev/null StdOut=/work/main/slurm-192.out'


@pytest.mark.parametrize("command_line", ["sleep 30 # A=1 B=two words", "echo JobState=PENDING Restarts=7 StartTime=x"])
def test_a_26_05_submit_line_never_overrides_slurms_fields(command_line):
    job = parse_kv_line(JOB_26_05.replace("sleep 30 # A=1 B=two words", command_line))
    assert (job["JobState"], job["Restarts"], job["StartTime"]) == ("RUNNING", "0", "2026-11-24T07:00:54")
    assert job["TimeLimit"] == "00:05:00" and job["PreemptTime"] == "None" and job["QOS"] == "low"
    assert job["SubmitLine"].startswith("sbatch --parsable --qos=low") and job["WorkDir"] == "/work/main"
