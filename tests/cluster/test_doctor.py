"""`hpctrain doctor` against the live dev cluster: passes as configured, names what is wrong otherwise."""

import json
import os
import re
import subprocess

import pytest

from helpers.cli import run_cli
from helpers.paths import REPO

pytestmark = pytest.mark.slurm

DEV = (REPO / "site_configs" / "dev.toml").read_text()


def doctor(site: str, *extra: str) -> tuple[int, dict[str, dict[str, str]]]:
    out = run_cli("doctor", "--site", site, "--json", *extra)
    assert "Traceback" not in out.stderr
    checks = json.loads(out.stdout)
    return out.returncode, {c["name"]: c for c in checks}


def site_file(tmp_path, text):
    path = tmp_path / "site.toml"
    path.write_text(text)
    return str(path)


def test_dev_site_passes(dev_cluster):
    rc, checks = doctor("dev")
    assert rc == 0
    assert {c["verdict"] for c in checks.values()} == {"PASS"}
    assert checks["preemption"]["detail"] == "preempt/qos, high preempts low"
    assert checks["partition gpu"]["detail"] == "3 nodes, 4 GPUs per node"


def test_doctor_names_the_release_and_what_hpctrain_does_on_it(dev_cluster):
    """The dev cluster keeps cred_expire=10 and sets no requeue_delay (scripts/dev-cluster)."""
    release = subprocess.run(["scontrol", "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    major, minor = map(int, release.split(".")[:2])
    detail = doctor("dev")[1]["slurm version"]["detail"]
    assert detail.startswith(f"{major}.{minor:02d}.")
    assert "a requeued job waits 10 s before it may start (AuthInfo cred_expire)" in detail
    assert ("leaves it to Slurm" in detail) is ((major, minor) >= (24, 11))
    assert ("squeue --only-job-state" in detail) is ((major, minor) >= (23, 11))


def test_table_output_has_verdict(dev_cluster):
    out = run_cli("doctor", "--site", "dev")
    assert out.returncode == 0
    assert "doctor: site 'dev' is ready" in out.stdout


def test_missing_qos_fails_precisely(dev_cluster, tmp_path):
    rc, checks = doctor(site_file(tmp_path, DEV + "\n[qos.bogus]\n"))
    assert rc == 1
    assert checks["qos"] == {
        "name": "qos",
        "verdict": "FAIL",
        "detail": "QOS 'bogus' named in the site config (qos.bogus) does not exist on the cluster (has: deadline, high, low, normal)",
    }


def test_too_many_gpus_per_node_fails(dev_cluster, tmp_path):
    rc, checks = doctor(site_file(tmp_path, DEV.replace("gpus_per_node = 4", "gpus_per_node = 8", 1)))
    assert rc == 1
    assert checks["partition gpu"]["detail"] == (
        "site config says 8 GPUs per node (partitions.gpu.gpus_per_node), but n1, n2, n3 have 4"
    )


def test_missing_partition_and_account_fail(dev_cluster, tmp_path):
    text = DEV.replace("[partitions.debug]", "[partitions.bigmem]").replace("debug = 0.0", "bigmem = 0.0")
    text = text.replace('"teamb"]', '"teamc"]')
    rc, checks = doctor(site_file(tmp_path, text))
    assert rc == 1
    assert checks["partition bigmem"]["detail"] == (
        "partition 'bigmem' (partitions.bigmem) does not exist on the cluster (has: debug, gpu)"
    )
    assert checks["accounts"]["detail"] == (
        "account(s) 'teamc' named in the site config (accounts) do not exist on the cluster (has: root, teama, teamb)"
    )


def test_preemptible_qos_not_preempted_fails(dev_cluster, tmp_path):
    text = DEV.replace('[qos.normal]', '[qos.normal]\npreemptible = true')
    rc, checks = doctor(site_file(tmp_path, text))
    assert rc == 1
    assert "QOS 'normal' is marked preemptible (qos.normal.preemptible) but no QOS preempts it" in checks["preemption"]["detail"]


def test_controller_unreachable_skips_cluster_checks(dev_cluster, tmp_path):
    conf = (tmp_path / "slurm.conf")
    text = re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=16999", open(dev_cluster["SLURM_CONF"]).read())
    conf.write_text(text)
    (tmp_path / "gres.conf").write_text(open(os.path.join(os.path.dirname(dev_cluster["SLURM_CONF"]), "gres.conf")).read())
    site = site_file(tmp_path, DEV.replace('conf = "${HPCTRAIN_DEV_ROOT:-/var/tmp/hpctrain-dev}/etc/slurm.conf"', f'conf = "{conf}"'))
    rc, checks = doctor(site)
    assert rc == 1
    assert checks["controller"]["verdict"] == "FAIL"
    assert checks["controller"]["detail"] == "scontrol ping: Slurmctld(primary) at vm is DOWN"
    assert checks["qos"] == {"name": "qos", "verdict": "SKIP", "detail": "controller unreachable"}
    assert checks["ledger"]["verdict"] == "PASS"
