"""What a user's value may do at submit: never become another program's option, never carry a secret into the
batch script, never run user code on the login node, never swallow the batch script's own lines. Every route
of each kind: the job spec, the site config, the submitit-style `Executor`, a sweep's parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.config.loading import validate
from hpctrain.config.shell import check_shell_command
from hpctrain.contract import JobPaths
from hpctrain.errors import ConfigError
from hpctrain.submit.executor import Executor
from hpctrain.submit.lineage import entry_point
from hpctrain.submit.placement import Placement
from hpctrain.submit.render import render_script

from helpers.paths import REPO

PLACEMENT = Placement(partition="debug", account="teama", qos="normal", reason="test")


def spec(**fields: object) -> JobSpec:
    return validate(JobSpec, {"name": "safe", "command": ["python", "train.py"], **fields}, "spec.toml")


def rendered(job: JobSpec, tmp_path: Path) -> str:
    return render_script(job, load_site("dev"), PLACEMENT, JobPaths(tmp_path / "job"), "1")


# Values read as options.

@pytest.mark.parametrize("name", ["-P", "-L", "--", "-", "-e"])
def test_the_job_runs_in_the_directory_its_spec_names_whatever_its_name(tmp_path, name):
    """The script's `cd` line, run by bash: `cd -P`, `cd --` or `cd -` would go to $HOME or $OLDPWD."""
    (tmp_path / name).mkdir()
    line = next(ln for ln in rendered(spec(workdir=name), tmp_path).splitlines() if ln.startswith("cd "))
    out = subprocess.run(["bash", "-c", f"set -e; cd /; cd {tmp_path}; {line}; pwd"], capture_output=True, text=True,
                         env={**os.environ, "HOME": "/", "OLDPWD": "/"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / name)


@pytest.mark.parametrize("launcher, resources", [("srun", {}), ("srun", {"nodes": 2}), ("none", {})])
def test_the_command_is_never_an_option_of_srun_or_hpctrain_launch(tmp_path, launcher, resources):
    script = rendered(spec(launcher=launcher, resources=resources), tmp_path)
    line = next(ln for ln in script.splitlines() if ln.endswith("python train.py &"))
    assert line.startswith("python") if launcher == "none" else line.endswith(" -- python train.py &")


@pytest.mark.parametrize("fields", [
    {"command": ["-o/tmp/x", "train.py"]},
    {"command": ["--output=/tmp/x"]},
    {"container": {"image": "--bind=/:/host"}},
    {"container": {"image": "-"}},
])
def test_a_spec_value_that_a_program_would_read_as_an_option_is_refused(fields):
    with pytest.raises(ConfigError) as info:
        spec(**fields)
    assert len(str(info.value).splitlines()) == 1 and "starts with '-'" in str(info.value)


def site_file(tmp_path: Path, section: str, key: str, value: object) -> str:
    """The dev site config with ``section.key`` set (section "": top level), as a file."""
    data = tomllib.loads((REPO / "site_configs" / "dev.toml").read_text())
    (data.setdefault(section, {}) if section else data)[key] = value
    path = tmp_path / "site.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("section, key", [("containers", "apptainer"), ("containers", "python"), ("launch", "python")])
def test_a_site_program_that_starts_with_a_dash_is_refused(tmp_path, section, key):
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: '-B/:/x' starts with '-'"):
        load_site(site_file(tmp_path, section, key, "-B/:/x"))


def test_apptainer_and_launch_options_take_their_values_in_one_word(tmp_path):
    """`--pwd=DIR`, `--inside=CMD`, `--python=PATH`: a value is never a word of its own that could pass for an option."""
    site = load_site("dev")
    site.containers.runtime = "apptainer"
    job = spec(resources={"nodes": 2}, container={"image": "/images/a.sif", "workdir": "/work"})
    script = render_script(job, site, PLACEMENT, JobPaths(tmp_path / "job"), "1")
    assert "--pwd=/work " in script and "'--inside=" in script and " --python=python3 " in script


# Secrets and code where they must not be.

@pytest.mark.parametrize("field", [("workdir",), ("data", "index"), ("checkpoint", "dir"), ("container", "workdir")])
def test_a_path_naming_a_secret_is_refused_and_others_expand(monkeypatch, field):
    monkeypatch.setenv("TOKEN", "s3cr3t-value")
    monkeypatch.setenv("PROJECT_DIR", "/proj")
    data: dict = {"env": {"TOKEN": {"secret": True}}, "container": {"image": "/images/a.sif"}}
    node = data
    for part in field[:-1]:
        node = node.setdefault(part, {})
    node[field[-1]] = "$PROJECT_DIR/x"
    assert "/proj/x" in json.dumps(spec(**data).redacted())
    node[field[-1]] = "$PROJECT_DIR/${TOKEN}"
    with pytest.raises(ConfigError) as info:
        spec(**data)
    assert f"{'.'.join(field)}: $TOKEN is a secret" in str(info.value)
    assert "s3cr3t-value" not in str(info.value)


def test_a_sweep_parameter_cannot_bring_a_secret_into_a_path(monkeypatch):
    monkeypatch.setenv("TOKEN", "s3cr3t-value")
    job = spec(env={"TOKEN": {"secret": True}})
    with pytest.raises(ConfigError, match=r"checkpoint\.dir: \$TOKEN is a secret"):
        job.with_params({"checkpoint.dir": "/ck/$TOKEN"})


def test_the_executor_cannot_bring_a_secret_into_its_workdir(monkeypatch):
    monkeypatch.setenv("TOKEN", "s3cr3t-value")
    ex = Executor(site="dev")
    ex.update_parameters(env={"TOKEN": {"secret": True}}, workdir="/runs/$TOKEN")
    with pytest.raises(ConfigError, match=r"executor parameters: workdir: \$TOKEN is a secret"):
        ex.job_spec(1)


@pytest.fixture
def user_package(tmp_path: Path) -> Path:
    """pkg/__init__.py that leaves a mark when imported, with pkg/train.py and pkg/__main__.py."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nprint('user code ran')\n")
    (pkg / "train.py").write_text("print('train')\n")
    (pkg / "__main__.py").write_text("print('main')\n")
    return tmp_path


@pytest.mark.parametrize("module, found", [("pkg.train", "pkg/train.py"), ("pkg", "pkg/__main__.py"),
                                           ("pkg.missing", None), ("pkg.train.sub", None)])
def test_lineage_finds_a_module_entry_point_without_importing_it(user_package, capsys, module, found):
    path = entry_point(["python", "-m", module], user_package)
    assert path == (user_package / found if found else None)
    assert not (user_package / "imported").exists() and "user code ran" not in capsys.readouterr().out


def test_lineage_of_torchrun_by_module_does_not_import_torch():
    probe = ("import sys; from pathlib import Path; from hpctrain.submit.lineage import entry_point; "
             "p = entry_point(['python', '-m', 'torch.distributed.run', 'train.py'], Path('/')); "
             "print(p.name, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["run.py", "False"]


# Setup items: each a complete shell command.

@pytest.mark.parametrize("item", ["module load cuda/12", "source env.sh && conda activate x", "if true; then a; fi",
                                  "echo 'a\\'", "export A=$(date +%s)  # comment \\", "f() { echo; }"])
def test_complete_commands_are_accepted(item):
    assert check_shell_command(item) == item


@pytest.mark.parametrize("item", ["echo 'a", "echo $(date", "{ echo", "cat <<EOF", "echo a \\", "case x in"])
def test_an_incomplete_command_would_swallow_the_script_and_is_refused(tmp_path, item):
    """What the check claims, shown with bash: the item, then a line of the script, never runs that line."""
    out = subprocess.run(["bash", "-c", f"{item}\necho REACHED"], capture_output=True, text=True, input="")
    assert "REACHED" not in out.stdout.splitlines()
    with pytest.raises(ValueError, match="not a complete shell command"):
        check_shell_command(item)


def test_setup_is_checked_on_every_route(tmp_path):
    with pytest.raises(ConfigError, match=r"setup\[1\]: not a complete shell command"):
        spec(setup=["module load x", "echo 'a"])
    with pytest.raises(ConfigError, match=r"setup\[0\]: not a complete shell command"):
        load_site(site_file(tmp_path, "", "setup", ["echo $(a"]))
    ex = Executor(site="dev")
    ex.update_parameters(setup=["if true; then"])
    with pytest.raises(ConfigError, match=r"executor parameters: setup\[0\]: not a complete shell command"):
        ex.job_spec(1)
