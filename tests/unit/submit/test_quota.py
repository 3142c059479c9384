"""Quota checks and pending-reason sentences without a cluster (the recorded releases are in test_slurm_outputs)."""

from __future__ import annotations

from hpctrain.jobs.pending import LIMIT_REASONS, SENTENCES, explain
from hpctrain.slurm import assoc_mgr
from hpctrain.slurm.assoc_mgr import Limit, Usage
from hpctrain.config import load_site
from hpctrain.submit.quota import ASSOC_LIMITS, JobNeeds, parallel_cap, user_limits, verdict

QOS_RECORD = """Current Association Manager state

QOS Records

QOS=normal(1)
    UsageRaw=9.989578
    GrpJobs=N(0) GrpJobsAccrue=N(0) GrpSubmitJobs=N(0) GrpWall=N(0.17)
    GrpTRES=cpu=N(0),mem=N(0),gres/gpu=16(5)
    MaxWallPJ=120
    MaxTRESPJ=gres/gpu=4
    Account Limits
      teama
        MaxJobsPA=N(0) MaxJobsAccruePA=N(0) MaxSubmitJobsPA=N(0)
        MaxTRESPA=cpu=N(0),gres/gpu=2(1)
    User Limits
      1001
        MaxJobsPU=N(3) MaxJobsAccruePU=N(0) MaxSubmitJobsPU=N(4)
        MaxTRESPU=cpu=N(0),gres/gpu=8(3)
"""


def test_a_qos_record_with_per_account_and_per_user_sections():
    assocs, (normal,) = assoc_mgr.parse(QOS_RECORD)
    assert assocs == [] and normal.name == "normal"
    assert normal.values["GrpTRES:gres/gpu"] == Usage(16, 5) and normal.values["GrpJobs"] == Usage(None, 0)
    assert normal.values["MaxWallPJ"] == Usage(120, None) and normal.values["MaxTRESPJ:gres/gpu"] == Usage(4, None)
    assert "MaxTRESPA:gres/gpu" not in normal.values  # another account's limit is not the QOS's
    assert normal.users["1001"]["MaxTRESPU:gres/gpu"] == Usage(8, 3)


WHAT = {name: what for name, (what, _) in ASSOC_LIMITS.items()} | {"MaxTRESPU:gres/gpu": "running GPUs per user"}


def _limit(scope: str, name: str, limit: float, used: float = 0, how: str = "running") -> Limit:
    covers = () if scope.startswith("QOS ") else (scope.removeprefix("account ").split("/")[0],)
    return Limit(scope, WHAT[name], name, limit, used, how, covers)


LIMITS = [
    _limit("account teamb", "GrpTRES:gres/gpu", 8, 6),
    _limit("account teama", "GrpTRESMins:gres/gpu", 600, 590, "spent"),
    _limit("teama/root", "MaxSubmitJobs", 10, 8, "submitted"),
    _limit("QOS normal", "MaxWallPJ", 60, how="per job"),
    _limit("QOS normal per user", "MaxTRESPU:gres/gpu", 12, 3),
]


def test_what_can_never_start_and_what_will_wait():
    assert verdict(LIMITS, "teamb", "normal", JobNeeds(gpus=2, minutes=30)) == ([], [])
    never, waits = verdict(LIMITS, "teamb", "normal", JobNeeds(gpus=4, minutes=90))
    assert never == ["QOS normal allows 60 minutes per job; the job asks 90 minutes"]
    assert waits == ["it will wait: account teamb's running GPUs cap: 6 of 8 in use"]
    assert verdict(LIMITS, "teamb", "normal", JobNeeds(gpus=16, minutes=5))[0] == [
        "account teamb allows 8 running GPUs; the job asks 16 GPUs", "QOS normal per user allows 12 running GPUs per user; the job asks 16 GPUs"]
    # teama: its budget has 10 GPU-minutes left; 3 submitted jobs pass its cap of 10 with 8 queued.
    never, waits = verdict(LIMITS, "teama", "low", JobNeeds(gpus=1, minutes=20, jobs=3))
    assert never == ["teama/root's submitted jobs per user cap: 8 of 10 submitted, 3 more asked"]
    assert waits == ["account teama's GPU-minutes budget has 10 left and the job may use 20: it is stopped if the budget runs out"]
    assert verdict(LIMITS, "teama", "low", JobNeeds(gpus=0, minutes=20)) == ([], [])  # no GPU, no GPU budget


def test_a_spent_budget_refuses_any_gpu_job():
    spent = [_limit("account teama", "GrpTRESMins:gres/gpu", 600, 612, "spent")]
    assert verdict(spent, "teama", "normal", JobNeeds(gpus=1, minutes=1))[0] == [
        "account teama's GPU-minutes budget: 612 of 600 spent, the job may use 1"]


class Tree:
    """A SlurmClient's quota reads for root in teamc, below dept (which caps GPUs at 2), below root."""

    RECORDS = {
        "root": "ClusterName=dev Account=root UserName= Partition= Priority=0 ID=1\n    ParentAccount= Lft=1\n",
        "teamc": ("ClusterName=dev Account=teamc UserName= Partition= Priority=0 ID=33\n    ParentAccount=dept(32)\n"
                  "ClusterName=dev Account=teamc UserName=root(0) Partition= Priority=0 ID=34\n    ParentAccount=\n"
                  "    GrpTRES=cpu=N(0),gres/gpu=N(0)\n"),
        "dept": ("ClusterName=dev Account=dept UserName= Partition= Priority=0 ID=32\n    ParentAccount=root(1)\n"
                 "    GrpTRES=cpu=N(0),gres/gpu=2(1)\n"),
    }

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def sacctmgr(self, entity: str, *where: str, fields: str) -> list[dict[str, str]]:
        return [{"account": "teamc", "qos": "normal"}] if entity == "assoc" else []

    def assoc_mgr(self, accounts: list[str], user: str, qos: list[str] | None = None) -> str:
        self.asked.append(accounts)
        return "".join(self.RECORDS[a] for a in accounts) + ("QOS Records\n\nQOS=normal(1)\n" if qos else "")


def test_the_caps_of_the_accounts_above_hold_for_the_users_account():
    client = Tree()
    limits = user_limits(load_site("dev"), client, "root")  # type: ignore[arg-type]
    assert client.asked == [["root", "teamc"], ["dept"]]  # one more call per level above root's children
    assert [(lim.scope, lim.slurm_name, lim.limit, lim.used, lim.covers) for lim in limits] == [
        ("account dept", "GrpTRES:gres/gpu", 2, 1, ("teamc",))]
    assert verdict(limits, "teamc", "normal", JobNeeds(gpus=4, minutes=5))[0] == [
        "account dept allows 2 running GPUs; the job asks 4 GPUs"]
    assert verdict(limits, "teama", "normal", JobNeeds(gpus=4, minutes=5)) == ([], [])
    assert explain("AssocGrpGRES", "teamc", "normal", limits) == (
        "its account's running-GPU cap is reached: account dept, 1 of 2 GPUs in use")


def test_pending_reasons_in_words():
    assert explain(None) is None and explain("None") is None
    assert explain("Priority") == SENTENCES["Priority"]
    assert explain("SomethingNew") == "Slurm says 'SomethingNew'"
    assert set(LIMIT_REASONS) <= set(SENTENCES)
    # The numbers come from the job's own account or QOS only.
    assert explain("AssocGrpGRES", "teama", "normal", LIMITS) == SENTENCES["AssocGrpGRES"]
    assert explain("AssocGrpGRES", "teamb", "normal", LIMITS) == (
        "its account's running-GPU cap is reached: account teamb, 6 of 8 GPUs in use")
    assert explain("QOSMaxGRESPerUser", "teamb", "normal", LIMITS) == (
        "your running-GPU cap in its QOS is reached: QOS normal per user, 3 of 12 GPUs in use")
    assert explain("AssocGrpGRESMinutes", "teama", "low", LIMITS) == (
        "its account's GPU-minute budget is spent: account teama, 590 of 600 GPU-minutes spent")
    assert explain("QOSMaxWallDurationPerJobLimit", "teama", "normal", LIMITS) == (
        "its time limit is above its QOS's per-job cap: QOS normal, 60 minutes per job")


def test_how_many_jobs_run_at_once_under_the_caps():
    assert parallel_cap(LIMITS, "teamb", "normal", gpus=2) == (
        4, "account teamb's running GPUs cap (8) holds 4 jobs of 2 GPUs")
    assert parallel_cap(LIMITS, "teama", "normal", gpus=2) == (
        6, "QOS normal per user's running GPUs per user cap (12) holds 6 jobs of 2 GPUs")
    assert parallel_cap(LIMITS, "teama", "low", gpus=2) is None  # a budget and a submit cap do not cap running jobs
    jobs_cap = [_limit("account teama", "GrpJobs", 3)]
    assert parallel_cap(jobs_cap, "teama", "low", gpus=0) == (3, "account teama's running jobs cap (3)")


def test_quota_prints_a_budget_in_gpu_hours_as_cost_does_and_no_number_with_an_exponent(monkeypatch):
    from click.testing import CliRunner

    from hpctrain.cli import cli

    limits = [_limit("account teama", "GrpTRESMins:gres/gpu", 10_000_000, 1_234_567.8, "spent"),
              _limit("teama/root", "MaxSubmitJobs", 2_000_000, 8, "submitted")]
    monkeypatch.setattr("hpctrain.submit.quota.user_limits", lambda *args, **kwargs: limits)
    out = CliRunner().invoke(cli, ["quota"])
    assert out.exit_code == 0, out.output
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in out.output.splitlines() if line.startswith("│")]
    assert rows == [["account teama", "GPU-hours", "GrpTRESMins:gres/gpu", "166666.7", "20576.1", "146090.5"],
                    ["teama/root", "submitted jobs per user", "MaxSubmitJobs", "2000000", "8", "1999992"]]
    assert "e+" not in out.output
