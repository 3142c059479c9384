"""A job's container: the srun options (pyxis/enroot) or the command prefix (Apptainer) its tasks run under.

The batch script itself, and with it hpctrain's bookkeeping (`attempt start|end`, the notice file), runs
on the host; the tasks run in the image, which needs hpctrain installed (site `containers.python`). The
job directory is mounted at its own path, so the journal, the notice file and the spec read the same
inside. pyxis options go on the srun line only: an `#SBATCH --container-*` line is refused by sites
whose sbatch lacks the plugin's configuration.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.contract import JobPaths
from hpctrain.errors import ConfigError


@dataclass(frozen=True)
class Wrap:
    """How every task of a job runs in its container."""

    srun_options: list[str] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)  # argv the task's command runs under
    python: str = "python3"  # inside the image: runs hpctrain's task shim

    def launch_options(self) -> list[str]:
        """The same, as `hpctrain launch` options."""
        return (
            [f"--srun-option={o}" for o in self.srun_options]
            + ([f"--inside={shlex.join(self.prefix)}"] if self.prefix else [])
            + [f"--python={self.python}"]
        )


def container_wrap(spec: JobSpec, site: SiteConfig, files: JobPaths) -> Wrap | None:
    """None when the spec names no image; one-line ConfigError when the site cannot run it."""
    c = spec.container
    if c is None:
        return None
    runtime = site.containers.runtime
    if runtime is None:
        raise ConfigError(
            f"container.image: site {site.name} has no container runtime (set [containers] runtime "
            "to 'pyxis' or 'apptainer' in its config)"
        )
    mounts = list(dict.fromkeys([f"{files.job_dir}:{files.job_dir}", *site.containers.binds, *c.mounts]))
    workdir = c.workdir or spec.workdir
    python = site.containers.python
    if runtime == "pyxis":
        if spec.launcher != "srun":
            raise ConfigError("container: pyxis starts containers through srun: launcher must be 'srun'")
        return Wrap(
            [
                f"--container-image={c.image}",
                f"--container-mounts={','.join(mounts)}",
                *([f"--container-workdir={workdir}"] if workdir else []),
            ],
            python=python,
        )
    gpus = ["--nv"] if spec.resources.gpus_per_node else []
    return Wrap(
        prefix=[
            site.containers.apptainer,
            "exec",
            *site.containers.apptainer_options,
            *gpus,
            "--bind",
            ",".join(mounts),
            *([f"--pwd={workdir}"] if workdir else []),
            c.image,
        ],
        python=python,
    )
