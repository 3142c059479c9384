"""An interactive session's job spec, from `hpctrain notebook`'s flags or a user's spec, and what is refused before
anything is submitted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.interactive import session_spec
from hpctrain.interactive.start import check_jupyter

from helpers.bad_input import assert_ledger_untouched, assert_rejected, invoke, spec_file

BATCH = """name = "gpt"
command = ["python", "-m", "hpctrain.train"]
setup = ["module load cuda"]
workdir = "/tmp"
[env]
WANDB_MODE = "offline"
TOKEN = { secret = true }
[data]
index = "/data/train/index.json"
[resources]
nodes = 2
gpus_per_node = 4
time = "04:00:00"
partition = "gpu"
[container]
image = "/images/train.sif"
[eval]
on_checkpoint = true
evaluators = { mine = ["python", "eval.py"] }
[retry]
in_place = 2
[array]
count = 3
"""


def test_from_flags_one_node_one_task_never_requeued():
    spec = session_spec(gpus=2, time="1:00:00", idle_minutes=15, port=8890, preemptible=True)
    assert spec.command == ["python", "-m", "hpctrain.interactive.serve"] and spec.launcher == "srun"
    r = spec.resources
    assert (r.nodes, r.tasks_per_node, r.gpus_per_node, r.time, r.preemptible) == (1, 1, 2, 3600, True)
    assert spec.requeue is False and spec.array is None and spec.container is None
    assert (spec.interactive.idle_minutes, spec.interactive.port) == (15, 8890)


def test_a_shell_session_needs_no_jupyterlab(tmp_path):
    spec = session_spec(shell=True, idle_minutes=5)
    assert spec.name == "shell" and spec.interactive.shell and spec.command[-1] == "hpctrain.interactive.serve"
    site = load_site("dev").model_copy(update={"launch": load_site("dev").launch.model_copy(
        update={"python": Path("/usr/bin/python3")})})
    check_jupyter(site, spec)  # a shell is a shell


def test_from_a_job_spec_keeps_its_environment_and_data(tmp_path):
    base = load_job_spec(spec_file(tmp_path, BATCH))
    spec = session_spec(base, gpus=1)
    assert spec.name == "gpt-notebook"
    assert (spec.setup, spec.workdir, spec.data.index) == (base.setup, base.workdir, base.data.index)
    assert spec.env == base.env and spec.container == base.container
    assert (spec.resources.nodes, spec.resources.gpus_per_node, spec.resources.partition) == (1, 1, "gpu")
    assert spec.resources.time == 4 * 3600  # the spec's, where no flag says otherwise
    assert spec.array is None and not spec.eval.on_checkpoint and spec.retry.in_place == 0
    assert spec.interactive.idle_minutes == 60
    # What the session runs in is what `hpctrain submit SPEC` runs in: the same image, unless --image says.
    assert session_spec(base, image="/images/lab.sif").container.image == "/images/lab.sif"


@pytest.mark.parametrize(("flags", "key"), [
    ({"time": "soon"}, "resources.time"), ({"idle_minutes": 0}, "interactive.idle_minutes"),
    ({"port": 70000}, "interactive.port"), ({"partition": "-p"}, "resources.partition"),
    ({"image": "-v"}, "container.image")])
def test_bad_values_are_refused_naming_the_key(flags, key):
    with pytest.raises(ConfigError) as err:
        session_spec(**flags)
    assert str(err.value).startswith("hpctrain notebook") and key in str(err.value)


def test_a_session_spanning_nodes_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"interactive.*one node"):
        load_job_spec(spec_file(tmp_path, 'name = "s"\ncommand = ["x"]\n[resources]\nnodes = 2\n[interactive]\n'))


def test_a_python_without_jupyterlab_is_refused_before_submitting(tmp_path):
    site = load_site("dev").model_copy(update={"launch": load_site("dev").launch.model_copy(
        update={"python": Path("/usr/bin/python3")})})
    spec = session_spec()
    with pytest.raises(HpctrainError, match=r"JupyterLab is not installed for /usr/bin/python3: pip install"):
        check_jupyter(site, spec)
    check_jupyter(load_site("dev"), spec)  # this environment has it
    check_jupyter(site, session_spec(image="/images/lab.sif"))  # an image is checked on the node


@pytest.mark.parametrize("args", [
    ["--idle-minutes", "0"], ["--port", "70000"], ["--gpus", "-1"], ["--time", "soon"], ["--spec", "/no/such.toml"],
    ["--partition", "-x"], ["--shell", "--port", "8888"], ["--shell", "--open"]])
def test_bad_flags_one_line_and_nothing_submitted(args, isolated_ledger):
    result = invoke("notebook", *args)
    assert_rejected(result.exit_code, result.stderr)
    assert_ledger_untouched(isolated_ledger)


def test_the_kernel_extension_loads_in_this_python():
    """The kernels' notice extension imports without the rest of hpctrain's heavy parts."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import hpctrain.interactive.notice, sys; "
                           "sys.exit('torch' in sys.modules)"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
