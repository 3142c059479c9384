"""Site config and job spec validation: every problem is one line naming file, key path and expectation."""

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config import JobSpec, load_job_spec, load_site
from hpctrain.config.types import format_slurm_time, parse_memory, parse_slurm_time
from hpctrain.errors import ConfigError

from helpers.cli import run_cli
from helpers.paths import REPO

GOOD_SPEC = """\
name = "gpt-tiny"
command = ["python", "-m", "train", "--lr", "3e-4"]
seed = 7

[resources]
nodes = 2
gpus_per_node = 4
time = "01:30:00"
mem = "32G"

[parallel]
dp = 2
tp = 2
pp = 2

[env]
PLAIN = "x"
WANDB_API_KEY = { secret = true }
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str, name: str = "spec.toml") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    return str(info.value).replace(str(path), name)


def test_good_spec_loads_with_derived_values(tmp_path):
    spec = load_job_spec(write(tmp_path, GOOD_SPEC))
    assert spec.resources.time == 5400
    assert spec.resources.mem == 32 * 1024
    assert spec.resources.ntasks_per_node == 4
    assert spec.parallel.world_size == 8
    assert spec.secret_names() == ["WANDB_API_KEY"]
    assert spec.env["PLAIN"].value == "x"


def test_yaml_spec_loads(tmp_path):
    text = "name: y\ncommand: [python, t.py]\nresources:\n  gpus_per_node: 2\n"
    assert load_job_spec(write(tmp_path, text, "spec.yaml")).resources.gpus_per_node == 2


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("nodes = 2", "nodes = 'two'", "resources.nodes: expected an integer, got 'two'"),
        ("nodes = 2", "nodes = '2'", "resources.nodes: expected an integer, got '2'"),
        ("nodes = 2", "gpu = 4", "resources.gpu: unknown key"),
        ('time = "01:30:00"', 'time = "25h"', "resources.time: expected a Slurm time such as '04:00:00' or '1-12:00:00', got '25h'"),
        ('mem = "32G"', 'mem = "lots"', "resources.mem: expected a memory size such as '16G' or '512M', got 'lots'"),
        ("nodes = 2", "nodes = 0", "resources.nodes: expected a number >= 1, got 0"),
        ("nodes = 2", 'preemptible = "yes"', "resources.preemptible: expected true, false or \"allowed\", got 'yes'"),
    ],
)
def test_bad_resource_values(tmp_path, old, new, expected):
    text = GOOD_SPEC.replace(old, new, 1)
    if old == "nodes = 2" and not new.startswith("nodes"):
        text = text.replace("[parallel]\ndp = 2", "[parallel]\ndp = 1")
    assert spec_error(tmp_path, text) == f"spec.toml: {expected}"


def test_missing_required_keys_are_each_one_line(tmp_path):
    assert spec_error(tmp_path, 'seed = 1\n').splitlines() == [
        "spec.toml: name: missing required key",
        "spec.toml: command: missing required key",
    ]


def test_unknown_top_level_key(tmp_path):
    assert spec_error(tmp_path, 'colour = "red"\n' + GOOD_SPEC) == "spec.toml: colour: unknown key"


def test_list_element_type_names_index(tmp_path):
    text = GOOD_SPEC.replace('"--lr", "3e-4"]', '"--lr", 3]')
    assert spec_error(tmp_path, text) == "spec.toml: command[4]: expected a string, got 3"


def test_bad_job_name(tmp_path):
    text = GOOD_SPEC.replace('name = "gpt-tiny"', 'name = "a b;rm"')
    assert spec_error(tmp_path, text) == (
        "spec.toml: name: expected a string matching ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$, got 'a b;rm'"
    )


def test_env_entry_without_value_or_secret(tmp_path):
    text = GOOD_SPEC + "BROKEN = { secret = false }\n"
    assert spec_error(tmp_path, text) == (
        "spec.toml: env.BROKEN: expected a value, or secret = true to take it from the submitting environment, "
        "got {'secret': False}"
    )


def test_env_name_must_be_a_variable_name(tmp_path):
    text = GOOD_SPEC + '"BAD-NAME" = "v"\n'
    assert spec_error(tmp_path, text) == "spec.toml: env.BAD-NAME: expected an environment variable name (letters, digits, _)"


def test_parallel_layout_must_fill_the_allocation(tmp_path):
    text = GOOD_SPEC.replace("pp = 2", "pp = 1")
    assert spec_error(tmp_path, text) == (
        "spec.toml: parallel: dp*tp*pp = 2*2*1 = 4 must equal nodes*tasks_per_node = 2*4 = 8"
    )


def test_invalid_toml_names_line(tmp_path):
    msg = spec_error(tmp_path, 'name = "x"\ncommand = ["a",,]\n')
    assert msg == "spec.toml: invalid TOML: Invalid value (at line 2, column 16)"


def test_invalid_yaml_names_line(tmp_path):
    msg = spec_error(tmp_path, "name: x\ncommand: [a\n", "spec.yaml")
    assert msg.startswith("spec.yaml: invalid YAML (line 3, column 1): ")


def test_top_level_must_be_a_table(tmp_path):
    assert spec_error(tmp_path, "- a\n- b\n", "spec.yaml") == "spec.yaml: expected a table of keys at the top level, got list"


# Site configs.

DEV = (REPO / "site_configs" / "dev.toml").read_text()


def site_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text, "site.toml")
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    return str(info.value).replace(str(path), "site.toml")


def test_shipped_site_configs_load():
    dev = load_site("dev")
    assert dev.partitions["gpu"].gpus_per_node == 4
    assert dev.qos["low"].preemptible and dev.qos["high"].preempts == ["low"]
    ib = load_site("example-ib-cluster")
    assert ib.network_env["NCCL_IB_HCA"].startswith("mlx5_")
    assert ib.partitions["h100"].mem_per_node == 2000 * 1024
    assert ib.partitions["a100-debug"].gpu_request == "gres"
    assert (ib.hang.startup_s, ib.hang.step_s, dev.hang.step_s) == (1800, 900, None)


def test_site_default_qos_must_be_defined(tmp_path):
    assert site_error(tmp_path, DEV.replace('qos = "normal"', 'qos = "bogus"', 1)) == (
        "site.toml: defaults.qos: QOS 'bogus' is not defined in this site config (defined: deadline, high, low, normal)"
    )


def test_site_preempts_reference_checked(tmp_path):
    assert site_error(tmp_path, DEV.replace('preempts = ["low"]', 'preempts = ["lowest"]')) == (
        "site.toml: qos.high.preempts[0]: QOS 'lowest' is not defined in this site config (defined: deadline, high, low, normal)"
    )


def test_site_wrong_type_in_partition(tmp_path):
    text = DEV.replace("gpus_per_node = 4", 'gpus_per_node = "four"', 1)
    assert site_error(tmp_path, text) == "site.toml: partitions.gpu.gpus_per_node: expected an integer, got 'four'"


def test_site_missing_section(tmp_path):
    text = DEV.replace("[paths]", "[unused]")
    assert site_error(tmp_path, text).splitlines() == ["site.toml: paths: missing required key", "site.toml: unused: unknown key"]


def test_site_checkpoint_mode_is_permission_bits(tmp_path):
    assert load_site("dev").checkpoint.mode == 0o600
    shared = write(tmp_path, DEV.replace("# mode = 0o640", "mode = 0o640"), "shared.toml")
    assert load_site(str(shared)).checkpoint.mode == 0o640
    assert site_error(tmp_path, DEV.replace("# mode = 0o640", "mode = 0o1640")) == (
        "site.toml: checkpoint.mode: expected permission bits from 0o000 to 0o777, such as 0o640, got 928")


def test_site_ledger_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_LEDGER", str(tmp_path / "l.db"))
    assert load_site("dev").ledger.path == tmp_path / "l.db"


def test_site_paths_expand_defaults(monkeypatch):
    monkeypatch.setenv("HPCTRAIN_DEV_ROOT", "/srv/devroot")
    assert str(load_site("dev").paths.checkpoints) == "/srv/devroot/checkpoints"
    monkeypatch.delenv("HPCTRAIN_DEV_ROOT")
    assert str(load_site("dev").paths.checkpoints) == "/var/tmp/hpctrain-dev/checkpoints"


def test_a_path_under_the_home_of_no_user_is_one_error_line(tmp_path):
    """Found by the typed-input cluster test: a spec's workdir "~0" (no user "0") crashed with Path's RuntimeError."""
    spec = tmp_path / "job.toml"
    spec.write_text('name = "x"\ncommand = ["true"]\nworkdir = "~no-such-user-0/run"\n')
    with pytest.raises(ConfigError, match="workdir: .*~no-such-user-0: no user of that name has a home directory"):
        load_job_spec(spec)


def test_cli_prints_config_errors_one_per_line(tmp_path):
    path = write(tmp_path, DEV.replace('qos = "normal"', 'qos = "bogus"', 1), "site.toml")
    out = run_cli("doctor", "--site", str(path))
    assert out.returncode == 2
    assert out.stderr == (
        f"hpctrain: error: {path}: defaults.qos: QOS 'bogus' is not defined in this site config (defined: deadline, high, low, normal)\n"
    )


# Field types.

@pytest.mark.parametrize(
    "text, seconds",
    [("30", 1800), (45, 2700), ("10:30", 630), ("01:00:00", 3600), ("2-00", 172800), ("1-12:30", 131400), ("1-00:00:05", 86405)],
)
def test_slurm_time(text, seconds):
    assert parse_slurm_time(text) == seconds


def test_slurm_time_format_round_trip():
    assert format_slurm_time(131400) == "1-12:30:00"
    assert format_slurm_time(3599) == "00:59:59"


@pytest.mark.parametrize("text, mb", [("16G", 16384), ("512M", 512), ("1T", 1048576), (2048, 2048), ("4gb", 4096)])
def test_memory(text, mb):
    assert parse_memory(text) == mb


# Parallel layout rules, checked when the spec is loaded (so at submit time).

LAYOUT = """\
name = "gpt"
command = ["python", "-m", "hpctrain.train"]

[resources]
nodes = 2
gpus_per_node = 4

[parallel]
dp = 2
tp = 2
pp = 2
micro_batch = 2
grad_accum = 4

[model]
layers = 8
heads = 8
hidden = 512
"""


@pytest.mark.parametrize("old, new, expected", [
    ("dp = 2", "dp = 1", "parallel: dp*tp*pp = 1*2*2 = 4 must equal nodes*tasks_per_node = 2*4 = 8"),
    ("gpus_per_node = 4", "gpus_per_node = 4\ntasks_per_node = 3",
     "parallel: dp*tp*pp = 2*2*2 = 8 must equal nodes*tasks_per_node = 2*3 = 6\n"
     "spec.toml: parallel.tp: tp = 2 must divide the 3 tasks per node (tensor-parallel peers share a node)"),
    ("layers = 8", "layers = 7", "model.layers: layers = 7 must be divisible by pp = 2"),
    ("heads = 8", "heads = 7", "model.heads: heads = 7 must be divisible by tp = 2\n"
     "spec.toml: model.hidden: hidden = 512 must be divisible by heads = 7"),
    ("hidden = 512", "hidden = 511", "model.hidden: hidden = 511 must be divisible by tp = 2\n"
     "spec.toml: model.hidden: hidden = 511 must be divisible by heads = 8"),
    ("grad_accum = 4", "grad_accum = 4\nglobal_batch = 32",
     "parallel.global_batch: global_batch = 32 must equal micro_batch*grad_accum*dp = 2*4*2 = 16"),
])
def test_layout_rules_name_the_numbers(tmp_path, old, new, expected):
    assert load_job_spec(write(tmp_path, LAYOUT)).parallel.samples_per_step == 16
    assert spec_error(tmp_path, LAYOUT.replace(old, new)) == f"spec.toml: {expected}"


def test_tp_must_stay_within_a_node(tmp_path):
    text = LAYOUT.replace("nodes = 2\ngpus_per_node = 4", "nodes = 4\ngpus_per_node = 2").replace("tp = 2", "tp = 4").replace("dp = 2", "dp = 1")
    assert spec_error(tmp_path, text) == (
        "spec.toml: parallel.tp: tp = 4 must divide the 2 tasks per node (tensor-parallel peers share a node)"
    )


def test_dumped_spec_validates_to_the_same_spec(tmp_path):
    spec = load_job_spec(write(tmp_path, GOOD_SPEC))
    again = JobSpec.model_validate(spec.redacted())
    assert again == spec
    assert spec.redacted()["resources"]["time"] == "01:30:00" and spec.redacted()["resources"]["mem"] == "32768M"


def test_dependencies_take_slurm_and_ledger_ids_as_integers_or_strings(tmp_path):
    path = tmp_path / "dep.toml"
    path.write_text('name = "d"\ncommand = ["true"]\n[dependency]\nafter = [1234, "1234_5"]\nafter_jobs = [3, "4"]\n')
    dep = load_job_spec(path).dependency
    assert (dep.after, dep.after_jobs) == (["1234", "1234_5"], [3, 4])
    for bad, message in (("after_jobs = [0]", "dependency.after_jobs[0]: expected a number >= 1, got 0"),
                         ('after_jobs = ["x"]', "dependency.after_jobs[0]: expected an integer, got 'x'"),
                         ("after = [true]", "dependency.after[0]: expected a string, got True")):
        path.write_text(f'name = "d"\ncommand = ["true"]\n[dependency]\n{bad}\n')
        with pytest.raises(ConfigError) as err:
            load_job_spec(path)
        assert str(err.value) == f"{path}: {message}"


def test_job_setup_lines_are_one_shell_line_each(tmp_path):
    path = tmp_path / "setup.toml"
    path.write_text('name = "s"\ncommand = ["true"]\nsetup = ["module load cuda/12.4", "source env.sh"]\n')
    assert load_job_spec(path).setup == ["module load cuda/12.4", "source env.sh"]
    path.write_text('name = "s"\ncommand = ["true"]\nsetup = ["module load a\\nrm -rf ~"]\n')
    with pytest.raises(ConfigError, match=r"setup\[0\]: expected one shell line per item"):
        load_job_spec(path)


def test_the_memory_tier_needs_restarts_in_the_allocation(tmp_path):
    text = LAYOUT + "\n[checkpoint]\nmemory_every_steps = 5\n"
    assert spec_error(tmp_path, text) == ("spec.toml: checkpoint.memory_every_steps: the memory tier serves restarts "
                                          "inside the allocation only: set retry.in_place too")
    assert load_job_spec(write(tmp_path, text + "\n[retry]\nin_place = 1\n")).checkpoint.memory_every_steps == 5


def test_spare_nodes_need_restarts_in_the_allocation(tmp_path):
    text = LAYOUT.replace("nodes = 2\n", "nodes = 2\nspare_nodes = 1\n")
    assert spec_error(tmp_path, text) == ("spec.toml: resources.spare_nodes: spare nodes serve restarts inside the "
                                          "allocation only: set retry.in_place and launcher = 'srun'")
    resources = load_job_spec(write(tmp_path, text + "\n[retry]\nin_place = 1\n")).resources
    # The layout fills the step's nodes; Slurm is asked for the spares too.
    assert (resources.nodes, resources.allocated_nodes, resources.allocated_gpus) == (2, 3, 12)


def test_a_site_config_loads_without_the_job_specs_models():
    # Every read command (status, the tick, cost) loads the site config: building the job spec's models as well cost
    # each of them about 0.1 CPU-s as typed (issue 59).
    code = (
        "import sys\nfrom hpctrain.config import load_site\n"
        f"load_site({str(REPO / 'site_configs' / 'dev.toml')!r})\nprint('hpctrain.config.job' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "False\n"


def test_a_list_of_node_counts_is_the_shapes_a_job_may_start_on(tmp_path):
    """`nodes = [2, 1]`: 2 nodes, or 1 where it starts sooner; on 1 the data-parallel width halves and gradient
    accumulation doubles, so the global batch stays (issue 63)."""
    spec = load_job_spec(write(tmp_path, GOOD_SPEC.replace("nodes = 2", "nodes = [2, 1]")))
    assert (spec.resources.nodes, spec.resources.shapes, spec.resources.node_counts) == (2, [2, 1], [2, 1])
    one = spec.shaped(1)
    assert (one.resources.nodes, one.resources.shapes) == (1, None)
    p = one.parallel
    assert (p.dp, p.tp, p.pp, p.grad_accum, p.samples_per_step) == (1, 2, 2, 2, spec.parallel.samples_per_step)
    assert list(one.problems()) == [] and spec.shaped(2).parallel == spec.parallel
    assert JobSpec.model_validate(spec.redacted()).resources.shapes == [2, 1]  # as the ledger keeps it


def test_a_job_of_shapes_asks_slurm_for_each_and_trains_on_the_one_it_is_given(tmp_path):
    """Submitted on its smaller shape, the job still names every shape to sbatch (Slurm allocates the most it can
    without delaying the start, and again after a requeue); the trainer takes the layout of the nodes it got."""
    spec = load_job_spec(write(tmp_path, GOOD_SPEC.replace("nodes = 2", "nodes = [2, 1]")))
    r = spec.resources
    assert (r.slurm_nodes(False), r.slurm_nodes(True)) == ("1-2", "1-2")
    four_or_two = r.model_copy(update={"nodes": 4, "shapes": [4, 2]})
    assert (four_or_two.slurm_nodes(True), four_or_two.slurm_nodes(False)) == ("2,4", "2-4")
    assert spec.shaped(1).resources.slurm_nodes(True) == "1"
    submitted = spec.shaped(1).model_copy(update={"resources": spec.shaped(1).resources.model_copy(
        update={"shapes": [2, 1]})})
    two = submitted.on_nodes(2).parallel
    assert (two.dp, two.grad_accum, two.samples_per_step) == (spec.parallel.dp, spec.parallel.grad_accum,
                                                              spec.parallel.samples_per_step)
    assert submitted.on_nodes(1) is submitted
    # A spec whose layout is one process's (its tasks are the user's own) keeps it on any shape.
    single = JobSpec.model_validate({"name": "own", "command": ["true"], "resources": {"nodes": [1, 2]}})
    assert single.on_nodes(2).parallel == single.parallel and single.on_nodes(2).resources.nodes == 2
    error = spec_error(tmp_path, GOOD_SPEC.replace("nodes = 2", "nodes = [2, 1]\nspare_nodes = 1"))
    assert error.startswith("spec.toml: resources: spare_nodes: a job of several shapes keeps none (it runs on the "
                            "largest it is given)") and len(error.splitlines()) == 1, error


def test_a_time_list_or_auto_is_the_runs_a_long_job_may_go_in(tmp_path):
    """`time = ["24:00:00", "04:00:00"]`: a day, or 4-hour runs each requeued at its limit (issue 63); "auto": the
    site's time or 3-hour runs. Each in one line where it cannot be."""
    spec = load_job_spec(write(tmp_path, GOOD_SPEC.replace('time = "01:30:00"', 'time = ["24:00:00", "04:00:00"]')))
    assert (spec.resources.time, spec.resources.time_chunks) == (86400, [14400])
    assert JobSpec.model_validate(spec.redacted()).resources.time_chunks == [14400]  # as the ledger keeps it
    auto = load_job_spec(write(tmp_path, GOOD_SPEC.replace('time = "01:30:00"', 'time = "auto"')))
    assert (auto.resources.time, auto.resources.time_chunks) == (None, [3 * 3600])
    chunked = GOOD_SPEC.replace('time = "01:30:00"', 'time = ["01:00:00", "00:10:00"]')
    for text, said in ((chunked.replace('"00:10:00"', '"02:00:00"'), "resources.time: expected a Slurm time, a list of them longest first"),
                       (chunked.replace('"00:10:00"', '"x"'), "resources.time: expected a Slurm time, a list of them"),
                       ("requeue = false\n" + chunked, "resources.time: a run in chunks is requeued at each chunk's")):
        error = spec_error(tmp_path, text)
        assert said in error and len(error.splitlines()) == 1, error


@pytest.mark.parametrize(("nodes", "said"), [
    ("[3, 2]", "spec.toml: resources.nodes: on 2 nodes dp = 2: the global batch of 3 samples is no whole number of "
               "micro_batch*dp = 2"),
    ("[2, 2]", "spec.toml: resources: shapes: expected distinct node counts of at least 1, got [2, 2]"),
    ("[]", "spec.toml: resources.nodes: "),
])
def test_shapes_the_layout_cannot_run_on_are_refused_in_one_line(tmp_path, nodes, said):
    text = GOOD_SPEC.replace("nodes = 2", f"nodes = {nodes}")
    text = text.replace("dp = 2", "dp = 3") if nodes == "[3, 2]" else text
    error = spec_error(tmp_path, text)
    assert error.startswith(said) and len(error.splitlines()) == 1, error
