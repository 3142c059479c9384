"""The bounds a site config and a job spec put on how often checkpoints are taken, each refused at load in one
line: a site's rate of interruptions that lose work (checkpoint.mtbi_hours), the cap on "auto"'s interval, and a
spec's every_minutes (issues 56.11 and 57.7)."""

from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.errors import ConfigError

from helpers.paths import REPO

DEV = (REPO / "site_configs" / "dev.toml").read_text()
SPEC = 'name = "j"\ncommand = ["true"]\n[checkpoint]\n'


def one_line_error(load, path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message.replace(str(path), path.name)


def site_with(tmp_path: Path, checkpoint: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(DEV.replace("[checkpoint]\n", f"[checkpoint]\n{checkpoint}\n"))
    return path


@pytest.mark.parametrize("line", ["mtbi_hours = 0", "mtbi_hours = 0.0005", "preemptible_mtbi_hours = 0.0001"])
def test_a_site_whose_interruptions_would_save_at_every_step_is_refused(tmp_path, line):
    key = line.split(" =")[0]
    assert one_line_error(lambda p: load_site(str(p)), site_with(tmp_path, line)) == (
        f"site.toml: checkpoint.{key}: expected a number >= 0.001, got {line.split('= ')[1]}"
    )


def test_autos_cap_is_the_sites_and_bounded(tmp_path):
    assert load_site(str(site_with(tmp_path, "max_interval_minutes = 30"))).checkpoint.max_interval_minutes == 30
    assert load_site(str(site_with(tmp_path, ""))).checkpoint.max_interval_minutes == 120
    assert "checkpoint.max_interval_minutes: expected a number <= 43200" in one_line_error(
        lambda p: load_site(str(p)), site_with(tmp_path, "max_interval_minutes = 1e308")
    )


@pytest.mark.parametrize("value", ["1e308", "43201", "0", "-5"])
def test_every_minutes_out_of_bounds_is_refused_at_load(tmp_path, value):
    """Issue 57.7: every_minutes = 1e308 passed the spec and killed both ranks of the trainer at step 10 with an
    OverflowError (its interval in steps)."""
    path = tmp_path / "spec.toml"
    path.write_text(SPEC + f"every_minutes = {value}\n")
    assert one_line_error(load_job_spec, path).startswith(
        'spec.toml: checkpoint.every_minutes: expected a number of minutes > 0 and <= 43200 (30 days) or "auto", got '
    )
    path.write_text(SPEC + "every_minutes = 43200\n")
    assert load_job_spec(path).checkpoint.every_minutes == 43200
