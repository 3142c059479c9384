"""The DeepSpeed config generated from a job spec; checkpoint permissions taken from the site config."""

import subprocess
from pathlib import Path
import sys

import pytest

from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError
from hpctrain.train.ds_config import ds_config

from helpers.paths import REPO


def spec(parallel=None, hyperparameters=None) -> JobSpec:
    return JobSpec(name="t", command=["python", "-m", "hpctrain.train"], parallel=parallel or {},
                   hyperparameters=hyperparameters or {})


def test_defaults_give_fp32_without_zero_and_torch_adamw():
    assert ds_config(spec()) == {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 1,
        "zero_optimization": {"stage": 0},
        "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"torch_adam": True, "lr": 3e-4, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def test_batch_sizes_precision_zero_and_hyperparameters_come_from_the_spec():
    config = ds_config(spec({"dp": 4, "tp": 2, "pp": 2, "micro_batch": 3, "grad_accum": 5, "zero_stage": 1,
                             "precision": "bf16"},
                            {"lr": 1e-3, "betas": (0.8, 0.9), "weight_decay": 0.0, "grad_clip": 0.5}))
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"],
            config["train_batch_size"]) == (3, 5, 60)
    assert config["zero_optimization"] == {"stage": 1} and config["bf16"] == {"enabled": True}
    assert config["optimizer"]["params"] == {"torch_adam": True, "lr": 1e-3, "betas": [0.8, 0.9], "eps": 1e-8,
                                             "weight_decay": 0.0}
    assert config["gradient_clipping"] == 0.5


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stages_the_pipeline_engine_rejects_are_a_config_error(stage):
    with pytest.raises(ConfigError, match=rf"zero_stage = {stage}: .*pipeline engine.*ZeRO stage 0 or 1"):
        ds_config(spec({"zero_stage": stage}))


def test_unknown_hyperparameters_are_a_config_error():
    with pytest.raises(ConfigError, match="unknown learning_rate"):
        ds_config(spec(hyperparameters={"learning_rate": 1e-3}))


def test_generating_the_config_imports_neither_torch_nor_deepspeed():
    code = "import sys, hpctrain.train.ds_config; print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_checkpoint_permissions_and_memory_tier_come_from_the_jobs_site_config(tmp_path, monkeypatch):
    from hpctrain.train.checkpointing import site_checkpoints

    monkeypatch.delenv("HPCTRAIN_SITE", raising=False)
    checkpoints, alerts, preemptible = site_checkpoints()
    assert (checkpoints.mode, checkpoints.memory_dir, alerts.slow_save_factor) == (0o600, Path("/dev/shm"), 5)
    assert preemptible is None
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text().replace("# mode = 0o640", "mode = 0o640")
                    .replace("[checkpoint]", f"[checkpoint]\nmemory_dir = '{tmp_path}/shm'")
                    + "\n[alerts]\nslow_save_factor = 8\n")
    monkeypatch.setenv("HPCTRAIN_SITE", str(site))
    checkpoints, alerts, preemptible = site_checkpoints()
    assert (checkpoints.mode, checkpoints.memory_dir, alerts.slow_save_factor) == (0o640, tmp_path / "shm", 8)
    assert preemptible == {"low"}  # the QOS the site marks preemptible


@pytest.mark.parametrize(("preemptible", "qos", "expected"), [
    (False, None, False), (True, None, True), ("allowed", None, True),  # outside Slurm: as the spec says
    ("allowed", "low", True), ("allowed", "normal", False), (False, "low", True),  # in a job: as its QOS is
])
def test_auto_assumes_preemptions_where_the_job_runs_in_a_preemptible_qos(preemptible, qos, expected):
    from hpctrain.contract import JobEnvironment
    from hpctrain.train.checkpointing import preempted_by_qos

    spec = JobSpec(name="j", command=["true"], resources={"preemptible": preemptible})
    env = JobEnvironment({"SLURM_JOB_ID": "7", "SLURM_JOB_QOS": qos} if qos else {})
    assert preempted_by_qos(spec, frozenset({"low"}) if qos else None, env) is expected
