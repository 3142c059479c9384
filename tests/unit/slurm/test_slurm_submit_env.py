"""The environment of the Slurm commands SlurmClient runs. sbatch run from inside a Slurm job (a scrontab tick, a job
submitting itself again) passes on none of that job's SLURM_* variables but SLURM_CONF: the new job would read them as
its own (SLURM_RESTART_COUNT as its requeues). A user's SLURM_TIME_FORMAT never reaches a command whose answer hpctrain reads (every time read is ISO), only the
job an sbatch submits."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.slurm import SlurmClient

JOB = {"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "1", "SLURM_ARRAY_JOB_ID": "40", "SLURM_MEM_PER_CPU": "1024"}


def submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, str]:
    """The variables an sbatch run by SlurmClient.sbatch sees, with ``env`` set."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "env"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\nenv > {seen}\necho 7\n")
    (bin_dir / "sbatch").chmod(0o755)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert SlurmClient(bin_dir=bin_dir).sbatch("#!/bin/sh\n") == "7"
    return dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)


def test_inside_a_job_the_jobs_slurm_variables_stay_behind(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_TIME_FORMAT", raising=False)
    conf = tmp_path / "slurm.conf"
    conf.touch()
    seen = submit(tmp_path, monkeypatch, {**JOB, "SLURM_CONF": str(conf), "SBATCH_ACCOUNT": "a"})
    assert not seen.keys() & set(JOB) and {"SLURM_CONF", "SBATCH_ACCOUNT"} <= seen.keys()
    assert "SLURM_TIME_FORMAT" not in seen  # none of the user's: none of hpctrain's either


def test_outside_a_job_the_environment_goes_as_it_is(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    seen = submit(tmp_path, monkeypatch, {"SLURM_TIME_FORMAT": "relative", "SBATCH_ACCOUNT": "a"})
    assert (seen["SLURM_TIME_FORMAT"], seen["SBATCH_ACCOUNT"]) == ("relative", "a")  # the job's own format


def test_a_users_time_format_never_reaches_sacct(tmp_path, monkeypatch):
    (tmp_path / "sacct").write_text('#!/bin/sh\nprintf "JobID|Submit\\n7|%s\\n" "$SLURM_TIME_FORMAT"\n')
    (tmp_path / "sacct").chmod(0o755)
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%m/%d %H:%M")
    assert [row["Submit"] for row in SlurmClient(bin_dir=tmp_path).sacct(["7"], ("JobID", "Submit"))] == ["standard"]
