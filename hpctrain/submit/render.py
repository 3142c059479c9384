"""Render sbatch scripts from Jinja2 templates.

Every value that reaches the script is validated or shell-quoted here, in Python; templates
only lay the pieces out. After rendering, the #SBATCH lines are checked against the list
built here, so no spec value can ever add a directive.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import jinja2

from hpctrain import __version__, contract
from hpctrain.bundled import data_dir
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.config.types import format_slurm_time
from hpctrain.contract import JobPaths
from hpctrain.errors import ConfigError
from hpctrain.submit.arrays import ArrayChunk
from hpctrain.submit.container import Wrap, container_wrap
from hpctrain.submit.placement import Placement

TEMPLATE_DIR = data_dir("sbatch_templates")
# Values on #SBATCH lines cannot be quoted reliably: allow only what needs no quoting.
_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_@%:,./+=\-\[\]]+$")
NOTICE_SIGNAL = "USR2"  # never USR1: NCCL uses it


def sbatch_option(option: str) -> str:
    """'--name=value', refused unless the value needs no quoting."""
    name, _, value = option.partition("=")
    if value and not _SBATCH_SAFE.match(value):
        raise ConfigError(
            f"#SBATCH {name}: {value!r} cannot go on an #SBATCH line (letters, digits and _@%:,./+=-[] only)"
        )
    return option


def gpu_directive(spec: JobSpec, site: SiteConfig, partition: str) -> str | None:
    gpus = spec.resources.gpus_per_node
    if not gpus:
        return None
    part = site.partitions[partition]
    if part.gpu_request == "gres":
        return f"--gres=gpu:{part.gpu_type + ':' if part.gpu_type else ''}{gpus}"
    return f"--gpus-per-node={gpus}"


def directives(
    spec: JobSpec,
    site: SiteConfig,
    placement: Placement,
    files: JobPaths,
    chunk: ArrayChunk | None,
    after: list[str],
    job_id: str,
    size_strings: bool = False,
) -> list[str]:
    """The #SBATCH options, each validated to be a single safe token (``size_strings``: Slurm reads a list of node
    counts, `Resources.slurm_nodes`)."""
    r = spec.resources
    opts = [
        f"--job-name={spec.name}",
        f"--partition={placement.partition}",
        f"--account={placement.account}",
        f"--qos={placement.qos}",
        f"--nodes={r.slurm_nodes(size_strings)}",
        # A node that fails leaves the allocation instead of ending it: the step restarts on the others.
        "--no-kill" if spec.retry.in_place else None,
        # Of a node range, --ntasks-per-node makes the job's task count the smallest count's, and Slurm then
        # allocates that many nodes whatever is free (22.05): a node's tasks are asked as its CPUs instead.
        f"--ntasks-per-node={r.ntasks_per_node}"
        if len(r.node_counts) == 1
        else f"--mincpus={r.ntasks_per_node * r.cpus_per_task}",
        f"--cpus-per-task={r.cpus_per_task}",
        gpu_directive(spec, site, placement.partition),
        f"--mem={r.mem}M" if r.mem else None,
        f"--time={format_slurm_time(r.time or site.defaults.time)}",
        f"--output={files.job_dir / files.output_name(chunk is not None)}",
        f"--comment={files.submission_tag(job_id)}",
        "--open-mode=append",  # a requeued run appends to the log instead of truncating it
        "--requeue" if spec.requeue else "--no-requeue",
        f"--signal=B:{NOTICE_SIGNAL}@{site.defaults.signal_lead_s}",
        "--export=ALL",  # the submitting environment, less the secrets: those travel in the secrets file
        f"--array={chunk.array_spec}" if chunk else None,
    ]
    deps = [f"{spec.dependency.kind}:{':'.join(spec.dependency.after)}"] if spec.dependency.after else []
    deps += [f"afterany:{':'.join(after)}"] if after else []
    deps += ["singleton"] if spec.dependency.singleton else []
    if deps:
        opts += [f"--dependency={','.join(deps)}", "--kill-on-invalid-dep=yes"]
    return [sbatch_option(o) for o in opts if o]


def exact(number: float) -> str:
    """``number`` in the fewest digits that read back as it ("1234567.7", not ":g"'s "1.23457e+06"); whole: no ".0"."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def exports(
    spec: JobSpec,
    site: SiteConfig,
    job_id: str,
    files: JobPaths,
    chunk: ArrayChunk | None,
    race_file: Path | None = None,
) -> list[tuple[str, str]]:
    """(NAME, shell-quoted value) pairs exported by the script; secrets are left out."""
    quiet_s = spec.hang.over(site.hang).output_s
    pairs = [
        (contract.JOB_ID_ENV, job_id),
        (contract.SITE_ENV, site.ref),
        (contract.JOB_DIR_ENV, str(files.job_dir)),
        (contract.JOURNAL_ENV, str(files.journal_dir)),
        (contract.SPEC_ENV, str(files.spec_file)),
        (contract.SCRIPT_ENV, str(files.script(chunk.index if chunk else 0))),
        (contract.SIGNAL_LEAD_ENV, str(site.defaults.signal_lead_s)),
        (contract.SEED_ENV, str(spec.seed)),
        *([(contract.HANG_OUTPUT_ENV, exact(quiet_s))] if quiet_s else []),
        *([(contract.RACE_FILE_ENV, str(race_file))] if race_file else []),
        *site.network_env.items(),
        *((k, v.value) for k, v in spec.env.items() if not v.secret and v.value is not None),
    ]
    return [(name, shlex.quote(value)) for name, value in pairs]


def shell_path(path: Path) -> str:
    """A path as one shell word that no command reads as an option (or `cd` as $OLDPWD): './-x', not '-x'."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def header_directives(script: str) -> list[str]:
    """The #SBATCH options sbatch reads: those before the first command line."""
    found = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            found.append(line[len("#SBATCH") :].strip())
        elif line.strip() and not line.startswith("#"):
            break
    return found


def template_environment(site: SiteConfig) -> jinja2.Environment:
    dirs = ([str(site.templates_dir)] if site.templates_dir else []) + [str(TEMPLATE_DIR)]
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(dirs),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def template_name(spec: JobSpec) -> str:
    r = spec.resources
    distributed = spec.launcher == "srun" and (max(r.node_counts) * r.ntasks_per_node > 1 or r.spare_nodes > 0)
    return "distributed.sh.j2" if distributed else "base.sh.j2"


def task_shim(spec: JobSpec, site: SiteConfig, python: Path, wrap: Wrap | None) -> str:
    """What the single task of a job step timed by `[hang]` runs under (ending with a space; '' when not timed):
    the task shim, which finds the task stopped past its deadline (hpctrain.launch.rankwatch). A step of several
    tasks always has it (`hpctrain launch`)."""
    hang = spec.hang.over(site.hang)
    if spec.launcher != "srun" or not (hang.startup_s or hang.step_s or hang.output_s):
        return ""
    return shlex.join([wrap.python if wrap else str(python), "-m", "hpctrain.launch.task", "--single", "--"]) + " "


def launch_options(spec: JobSpec, wrap: Wrap | None) -> str:
    """`hpctrain launch` options, ending with a space when there are any. A job that restarts its step in the
    allocation names the step's nodes: the rest are spares, or stand in for a node that failed; a job of several
    shapes names them all: its step runs on the largest the allocation holds."""
    r = spec.resources
    opts = ["--nodes", ",".join(map(str, r.node_counts))] if spec.retry.in_place or r.shapes else []
    opts += wrap.launch_options() if wrap else []
    return shlex.join(opts) + " " if opts else ""


def render_script(
    spec: JobSpec,
    site: SiteConfig,
    placement: Placement,
    files: JobPaths,
    job_id: str,
    chunk: ArrayChunk | None = None,
    after: list[str] | None = None,
    race_file: Path | None = None,
    size_strings: bool = False,
) -> str:
    """The complete batch script for one submission (one array chunk when ``chunk`` is given; one runner of a race
    when ``race_file`` is, hpctrain.runtime.race)."""
    sbatch = directives(spec, site, placement, files, chunk, after or [], job_id, size_strings)
    python = Path(site.launch.python or sys.executable)
    wrap = container_wrap(spec, site, files)
    context = {
        "version": __version__,
        "name": spec.name,
        "job_id": job_id,
        "directives": sbatch,
        "setup": site.setup,
        "job_setup": spec.setup,
        "exports": exports(spec, site, job_id, files, chunk, race_file),
        "secret_names": spec.secret_names(),
        "secrets_file": shlex.quote(str(files.secrets_file(job_id))),
        "chunk": chunk,
        "params_file": shlex.quote(str(files.params_file)),
        "command": shlex.join(spec.command),
        "workdir": shell_path(spec.workdir) if spec.workdir else None,
        "launcher": spec.launcher,
        "in_place": spec.retry.in_place,
        # Each ends with a space when set, so a job without a container renders as before.
        "container_srun": shlex.join(wrap.srun_options) + " " if wrap and wrap.srun_options else "",
        "container_prefix": shlex.join(wrap.prefix) + " " if wrap and wrap.prefix else "",
        "task_shim": task_shim(spec, site, python, wrap),
        "launch_options": launch_options(spec, wrap),
        "hpctrain": shlex.join([str(python), "-m", "hpctrain"]),
        "python_bin": shlex.quote(str(python.parent)),
    }
    try:
        text = template_environment(site).get_template(template_name(spec)).render(context)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"sbatch template {template_name(spec)}: {exc}") from None
    if header_directives(text) != sbatch:
        raise ConfigError(f"sbatch template {template_name(spec)}: #SBATCH lines differ from the ones hpctrain built")
    return text
