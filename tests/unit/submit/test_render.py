"""Rendered sbatch scripts: golden files, directives, signal handling, secrets, no injection."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.config.job import JobSpec
from hpctrain.config.site import Containers
from hpctrain.contract import JobPaths
from hpctrain.errors import ConfigError
from hpctrain.submit.arrays import ArrayChunk, plan_chunks
from hpctrain.submit.placement import Placement
from hpctrain.submit.render import directives, header_directives, render_script

from helpers.paths import ASSETS

SPECS = ASSETS / "specs"
GOLDEN = ASSETS / "golden"
PLACEMENT = Placement("gpu", "normal", "teama", "test")
FILES = JobPaths(Path("/shared/logs/job-42"))


@pytest.fixture
def site(monkeypatch):
    monkeypatch.delenv("HPCTRAIN_DEV_ROOT", raising=False)
    return load_site("dev")


@pytest.mark.parametrize("name, chunk, after", [
    ("single", None, []),
    ("distributed", None, []),
    ("array", ArrayChunk(1, 1000, 6, 2), ["4242"]),
])
def test_golden_scripts(site, name, chunk, after):
    site.launch.python = Path("/opt/hpctrain/bin/python")
    site._source = Path("/etc/hpctrain/sites/dev.toml")  # golden files must not depend on the checkout path
    script = render_script(load_job_spec(SPECS / f"{name}.toml"), site, PLACEMENT, FILES, "42", chunk, after)
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
@pytest.mark.parametrize("name", ["container-distributed", "container-single"])
def test_golden_container_scripts(site, runtime, name):
    """pyxis options on the srun line (never #SBATCH), Apptainer as the tasks' prefix; hpctrain's task shim runs
    in the image with its Python; the job directory, the site's binds and the spec's mounts are mounted."""
    site.launch.python = Path("/opt/hpctrain/bin/python")
    site._source = Path("/etc/hpctrain/sites/dev.toml")
    site.containers = Containers(runtime=runtime, binds=["/lustre", "/scratch:/scratch:rw"], python="/usr/bin/python3")
    script = render_script(load_job_spec(SPECS / f"{name}.toml"), site, PLACEMENT, FILES, "42")
    golden = GOLDEN / f"{name}-{runtime}.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()
    assert not any("container" in line for line in sbatch_lines(script))


def test_a_container_needs_a_runtime_and_pyxis_needs_srun(site):
    with pytest.raises(ConfigError, match="^container.image: site dev has no container runtime"):
        render_script(spec(container={"image": "/i.sif"}), site, PLACEMENT, FILES, "1")
    site.containers = Containers(runtime="pyxis")
    with pytest.raises(ConfigError, match="launcher must be 'srun'"):
        render_script(spec(container={"image": "ubuntu:24.04"}, launcher="none"), site, PLACEMENT, FILES, "1")


def spec(**overrides) -> JobSpec:
    data = {"name": "t", "command": ["python", "train.py"], "resources": {"gpus_per_node": 2}}
    data.update(overrides)
    return JobSpec.model_validate(data)


def sbatch_lines(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]


def test_signal_requeue_and_never_usr1(site):
    script = render_script(spec(), site, PLACEMENT, FILES, "1")
    lines = sbatch_lines(script)
    assert "#SBATCH --signal=B:USR2@60" in lines
    assert "#SBATCH --requeue" in lines and "#SBATCH --open-mode=append" in lines
    assert "USR1" not in script
    assert "trap 'forward USR2' USR2" in script and "trap 'forward TERM' TERM" in script
    # srun answers a TERM with SIGKILL for its tasks: it is passed the notice instead; a direct command the signal
    assert "\nnotice=USR2\n" in script
    assert "\nnotice=\n" in render_script(spec(launcher="none"), site, PLACEMENT, FILES, "1")


def test_a_failed_step_restarts_in_the_allocation_only_when_the_spec_asks(site):
    assert "attempt restart" not in render_script(spec(), site, PLACEMENT, FILES, "1")
    script = render_script(spec(retry={"in_place": 2}), site, PLACEMENT, FILES, "1")
    assert "retry.in_place = 2" in script and "attempt restart" in script
    assert script.index("while :; do") < script.index("train.py &") < script.index("attempt restart --exit-code") < script.index(
        "attempt end")
    # A failed node leaves the allocation without ending it (--no-kill).
    assert "#SBATCH --no-kill" in sbatch_lines(script) and "--no-kill" not in render_script(spec(), site, PLACEMENT,
                                                                                            FILES, "1")


@pytest.mark.parametrize("seconds, exported", [(1234567.7, "1234567.7"), (900, "900"), (0.1, "0.1")])
def test_the_quiet_output_limit_is_exported_with_every_digit(site, seconds, exported):
    script = render_script(spec(hang={"output_s": seconds}), site, PLACEMENT, FILES, "1")
    assert f"export HPCTRAIN_HANG_OUTPUT_S={exported}\n" in script


def test_spare_nodes_are_allocated_and_the_step_runs_on_the_others(site):
    script = render_script(spec(resources={"nodes": 2, "spare_nodes": 1, "gpus_per_node": 2}, retry={"in_place": 1}),
                           site, PLACEMENT, FILES, "1")
    assert "#SBATCH --nodes=3" in sbatch_lines(script) and "#SBATCH --no-kill" in sbatch_lines(script)
    assert re.search(r"-m hpctrain launch --nodes 2 -- python train.py &", script)
    # One node and a spare: still through `hpctrain launch`, which picks the node.
    single = render_script(spec(resources={"nodes": 1, "spare_nodes": 1, "tasks_per_node": 1}, retry={"in_place": 1}),
                           site, PLACEMENT, FILES, "1")
    assert "hpctrain launch --nodes 1 -- python train.py &" in single


def test_a_job_of_shapes_asks_for_each_and_its_step_takes_the_largest_it_is_given(site):
    """Issue 63: sbatch gets every shape (a list where Slurm reads one, else their range) and each node's tasks as
    CPUs: with --ntasks-per-node, Slurm 22.05 allocated a range's smallest count whatever was free."""
    shaped = spec(resources={"nodes": [4, 2], "gpus_per_node": 2, "cpus_per_task": 3})
    lines = sbatch_lines(render_script(shaped, site, PLACEMENT, FILES, "1", size_strings=True))
    assert {"#SBATCH --nodes=2,4", "#SBATCH --mincpus=6", "#SBATCH --cpus-per-task=3"} <= set(lines)
    assert not [ln for ln in lines if ln.startswith("#SBATCH --ntasks-per-node")]
    script = render_script(shaped, site, PLACEMENT, FILES, "1")
    assert "#SBATCH --nodes=2-4" in sbatch_lines(script) and "hpctrain launch --nodes 4,2 -- python train.py &" in script
    # One node or two of one task each: the distributed script, which launches the step on either.
    pair = render_script(spec(resources={"nodes": [1, 2], "tasks_per_node": 1}), site, PLACEMENT, FILES, "1")
    assert "#SBATCH --nodes=1-2" in sbatch_lines(pair) and "hpctrain launch --nodes 1,2 -- python train.py &" in pair


def test_gres_syntax_with_gpu_type():
    site = load_site("example-ib-cluster")
    script = render_script(spec(), site, Placement("a100-debug", "normal", "vision", "t"), FILES, "1")
    assert "#SBATCH --gres=gpu:a100:2" in sbatch_lines(script)


def test_no_requeue_and_dependencies(site):
    s = spec(requeue=False, dependency={"after": ["100", "101_3"], "kind": "afterany", "singleton": True})
    lines = sbatch_lines(render_script(s, site, PLACEMENT, FILES, "1"))
    assert "#SBATCH --no-requeue" in lines
    assert "#SBATCH --dependency=afterany:100:101_3,singleton" in lines


def test_secret_value_never_in_script(site):
    s = spec(env={"TOKEN": {"value": "hunter2", "secret": True}, "PLAIN": "visible"})
    script = render_script(s, site, PLACEMENT, FILES, "1")
    assert "hunter2" not in script
    assert "export PLAIN=visible" in script and "TOKEN" in script  # named in a comment only
    assert "hunter2" not in str(s.redacted())


NASTY = ["a\n#SBATCH --uid=0", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "it's \"quoted\"", "x; rm -rf /", "\\n"]


@pytest.mark.parametrize("value", NASTY)
def test_values_cannot_add_directives_or_commands(site, value):
    s = spec(command=["echo", value], env={"V": value}, workdir=f"/tmp/{value}", launcher="none")
    script = render_script(s, site, PLACEMENT, FILES, "1")
    assert header_directives(script) == directives(s, site, PLACEMENT, FILES, None, [], "1")
    # The script's own lines, run by bash, give back each value verbatim.
    lines = script.splitlines()
    export = next(i for i, ln in enumerate(lines) if ln.startswith("export V="))
    cd = next(i for i, ln in enumerate(lines) if ln.startswith("cd "))
    probe = "\n".join(lines[export:cd]) + '\nprintf "%s" "$V"'
    assert subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout == value
    start = next(i for i, ln in enumerate(lines) if ln.startswith("echo "))
    end = next(i for i in range(start, len(lines)) if lines[i].endswith(" &"))
    assert shlex.split("\n".join(lines[start:end + 1]).removesuffix(" &")) == ["echo", value]


def test_job_name_with_newline_is_refused():
    with pytest.raises(Exception) as info:
        spec(name="x\n#SBATCH --uid=0")
    assert "name" in str(info.value)


def test_unsafe_path_on_sbatch_line_is_refused(site, tmp_path):
    with pytest.raises(ConfigError) as info:
        render_script(spec(), site, PLACEMENT, JobPaths(Path("/logs/a b\n#SBATCH --uid=0")), "1")
    assert str(info.value) == (
        "#SBATCH --output: '/logs/a b\\n#SBATCH --uid=0/slurm-%j.out' cannot go on an #SBATCH line "
        "(letters, digits and _@%:,./+=-[] only)"
    )


def test_site_template_dir_overrides(site, tmp_path):
    (tmp_path / "base.sh.j2").write_text(
        "#!/bin/bash\n{% for d in directives %}#SBATCH {{ d }}\n{% endfor %}# site-specific prologue\n{{ command }}\n"
    )
    site.templates_dir = tmp_path
    script = render_script(spec(launcher="none", resources={}), site, PLACEMENT, FILES, "1")
    assert "# site-specific prologue" in script


def test_template_adding_directive_is_caught(site, tmp_path):
    (tmp_path / "base.sh.j2").write_text("#!/bin/bash\n#SBATCH --uid=0\n{% for d in directives %}#SBATCH {{ d }}\n{% endfor %}")
    site.templates_dir = tmp_path
    with pytest.raises(ConfigError, match="#SBATCH lines differ"):
        render_script(spec(launcher="none", resources={}), site, PLACEMENT, FILES, "1")


@pytest.mark.parametrize("n, limit, counts", [(30, 8, [8, 8, 8, 6]), (10000, 1001, [1001] * 9 + [991]), (5, 8, [5])])
def test_chunks_cover_every_index_once(n, limit, counts):
    chunks = plan_chunks(n, limit, 3)
    assert [c.count for c in chunks] == counts
    covered = [c.offset + t for c in chunks for t in range(c.count)]
    assert covered == list(range(n))
    assert all(c.array_spec == f"0-{c.count - 1}%3" for c in chunks)


def test_job_setup_runs_after_the_sites_and_before_the_command(site):
    site = site.model_copy(update={"setup": ["module purge"]})
    script = render_script(spec(setup=["module load cuda/12.4", "source $HOME/env.sh"]), site, PLACEMENT, FILES, "1")
    order = [script.index(line) for line in ("module purge\n", "# The job's setup.\nmodule load cuda/12.4\n"
                                              "source $HOME/env.sh\n", "export PATH=", "attempt start")]
    assert order == sorted(order)
    assert "# The job's setup." not in render_script(spec(), site, PLACEMENT, FILES, "1")
