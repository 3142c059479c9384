"""The site config: what one cluster offers and how hpctrain should use it."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import Field, FiniteFloat, PrivateAttr

from hpctrain.bundled import data_dir
from hpctrain.config.loading import Loc, StrictModel, read_mapping, validate
from hpctrain.config.policies import MAX_TIMEOUT_S, HangPolicy, IdlePolicy
from hpctrain.config.types import (
    ENV_NAME,
    MAX_EVERY_MINUTES,
    SLURM_NAME,
    SLURM_NAME_RULE,
    BindPath,
    ExpandedPath,
    FileMode,
    MiB,
    Program,
    ProgramPath,
    Seconds,
    ShellCommand,
    SlurmName,
)
from hpctrain.contract import LEDGER_ENV, SITE_DIR_ENV, SITE_ENV
from hpctrain.errors import ConfigError


class SlurmAccess(StrictModel):
    """How to reach the cluster's Slurm commands."""

    conf: ExpandedPath | None = Field(None, description="SLURM_CONF for every Slurm command (None: inherit)")
    bin_dir: ExpandedPath | None = Field(None, description="where sbatch, squeue, ... live (None: PATH)")
    timeout_s: FiniteFloat = Field(60.0, gt=0, le=MAX_TIMEOUT_S)
    max_array_size: int | None = Field(None, ge=1, description="None: read MaxArraySize from scontrol")


class Partition(StrictModel):
    gpus_per_node: int = Field(ge=0)
    gpu_type: SlurmName | None = None
    cpus_per_node: int = Field(gt=0)
    mem_per_node: MiB
    nodes: int | None = Field(None, ge=1)
    max_time: Seconds | None = None
    gpu_request: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    fabric_gb_s: FiniteFloat | None = Field(
        None,
        gt=0,
        description=(
            "all-reduce bus bandwidth (GB/s, nccl-tests' busbw) the inter-node fabric gives one GPU per node, as "
            "`hpctrain doctor --nccl` measures it: about the line rate of the NICs nearest one GPU, e.g. 50 for "
            "one 400 Gb/s NDR port; the doctor warns below half of it (None: the measurement is not judged)"
        ),
    )


class Qos(StrictModel):
    preemptible: bool = False
    preempts: list[str] = Field(default_factory=list)
    description: str = ""


class Defaults(StrictModel):
    account: SlurmName = "auto"
    partition: SlurmName
    qos: SlurmName = "normal"
    preemptible_qos: SlurmName | None = None
    time: Seconds = 3600
    signal_lead_s: int = Field(
        120,
        ge=10,
        le=65535,
        description=("seconds of notice before the time limit (sbatch --signal takes at most 65535)"),
    )


class Paths(StrictModel):
    data: ExpandedPath
    checkpoints: ExpandedPath
    scratch: ExpandedPath
    logs: ExpandedPath


class LedgerConfig(StrictModel):
    # the home directory read when the config is loaded: shared by every login node (hpctrain.ledger.storage)
    path: ExpandedPath = Field(default_factory=lambda: Path("~/.local/share/hpctrain/ledger.db").expanduser())
    mode: FileMode = Field(0o600, description="permissions of a new ledger file (TOML: 0o640 to share with the group)")


# A rate of lost work above one every 3.6 s is a typo: "auto" would save at almost every step.
MIN_MTBI_HOURS = 0.001


class CacheConfig(StrictModel):
    """The node-local cache of shards (hpctrain.data.cache) that a job's `data.cache = "node"` reads through."""

    dir: str | None = Field(
        None,
        min_length=1,
        description="a node-local directory: NVMe, ${SLURM_TMPDIR}, /dev/shm; ${VAR} and ~ expanded on the node "
        "(none: no cache)",
    )
    max_size: MiB | None = Field(None, description="the most the cache holds, e.g. '10T' (none: as its disk allows)")
    min_free: MiB = Field(1024, description="space the cache leaves free on its disk")
    prefetch: MiB | Literal[0] = Field(
        1024, description="how far past the shard it reads each loader worker fetches its next shards (0: none)"
    )


class CheckpointConfig(StrictModel):
    mode: FileMode = Field(
        0o600,
        description="permissions of the checkpoint manifests and rank fragments hpctrain "
        "writes (RNG states, lineage; TOML: 0o640 to share with the group)",
    )
    memory_dir: ExpandedPath = Field(
        Path("/dev/shm"),
        description="node-local memory (or disk) for the checkpoint memory tier (checkpoint.memory_every_steps)",
    )
    mtbi_hours: FiniteFloat = Field(
        24.0,
        ge=MIN_MTBI_HOURS,
        description="mean time between interruptions that lose work (crashes, node failures, hangs, kills without "
        'notice; not a preemption announced in time to save, nor the time limit) checkpoint every_steps = "auto" '
        "assumes for a job until it has its own history",
    )
    preemptible_mtbi_hours: FiniteFloat | None = Field(
        None,
        ge=MIN_MTBI_HOURS,
        description="the same for a job in the preemptible QOS (resources.preemptible), where preemptions may come "
        "without a notice in time to save (no GraceTime); default: mtbi_hours",
    )
    max_interval_minutes: FiniteFloat = Field(
        120.0,
        ge=1,
        le=MAX_EVERY_MINUTES,
        description='the longest interval "auto" chooses between saves (the training a crash may lose)',
    )

    def prior_mtbi_s(self, preemptible: bool) -> float:
        """The seconds between interruptions that lose work "auto" assumes before a job has a history of its own."""
        return ((preemptible and self.preemptible_mtbi_hours) or self.mtbi_hours) * 3600


class Alerts(StrictModel):
    """When `hpctrain status` flags a running job."""

    stall_minutes: FiniteFloat = Field(15.0, gt=0, description="no training step for this long")
    data_wait_fraction: FiniteFloat = Field(0.25, gt=0, le=1, description="share of step time spent waiting for data")
    slow_save_factor: FiniteFloat = Field(
        5.0, gt=1, description="a checkpoint that took this many times the median of the job's saves before it"
    )
    work_at_risk_minutes: FiniteFloat = Field(
        120.0, gt=0, description="training since the newest committed checkpoint (of a job that checkpoints)"
    )
    gpu_low_percent: FiniteFloat = Field(
        25.0, ge=0, le=100, description="a job whose GPUs were busy less than this on average over gpu_low_minutes"
    )
    gpu_low_minutes: FiniteFloat = Field(30.0, gt=0, le=10080, description="the window of gpu_low_percent")


class Launch(StrictModel):
    python: ProgramPath | None = Field(
        None, description="Python with hpctrain on the compute nodes (default: the submitting one)"
    )
    master_port_range: tuple[int, int] = Field((20000, 29999), strict=False)  # TOML gives a list


class Containers(StrictModel):
    """How jobs that name a container image run on this cluster."""

    runtime: Literal["pyxis", "apptainer"] | None = Field(
        None, description="pyxis/enroot (srun --container-*) or Apptainer (apptainer exec); None: no containers"
    )
    binds: list[BindPath] = Field(default_factory=list, description="host paths every container sees: src[:dst[:ro]]")
    apptainer: Program = Field("apptainer", description="the apptainer command on the compute nodes")
    apptainer_options: list[str] = Field(
        default_factory=list,
        description=(
            "more `apptainer exec` options, e.g. --cleanenv, or --no-privs where root may not hold every capability"
        ),
    )
    python: Program = Field("python3", description="the Python inside images, with hpctrain installed")


class SiteConfig(StrictModel):
    name: SlurmName
    description: str = ""
    slurm: SlurmAccess = Field(default_factory=SlurmAccess)
    defaults: Defaults
    partitions: dict[str, Partition] = Field(min_length=1)
    accounts: list[SlurmName] = Field(min_length=1)
    qos: dict[str, Qos] = Field(min_length=1)
    paths: Paths
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    network_env: dict[str, str] = Field(default_factory=dict, description="NCCL/InfiniBand settings")
    setup: list[ShellCommand] = Field(default_factory=list, description="shell commands run first in every job")
    gpu_hour_price: dict[str, FiniteFloat] = Field(default_factory=dict, description="per partition")
    launch: Launch = Field(default_factory=Launch)
    containers: Containers = Field(default_factory=Containers)
    alerts: Alerts = Field(default_factory=Alerts)
    hang: HangPolicy = Field(default_factory=HangPolicy, description="hang timeouts of every job that sets none")
    idle: IdlePolicy = Field(
        default_factory=IdlePolicy, description="GPU sampling and idleness of every job that sets none"
    )
    templates_dir: ExpandedPath | None = None
    _source: Path | None = PrivateAttr(None)

    @property
    def ref(self) -> str:
        """How a job finds this config again: the file it was loaded from, else its name."""
        return str(self._source) if self._source else self.name

    def problems(self) -> Iterator[tuple[Loc, str]]:
        """Names used as keys, and cross-references between sections: what the field types cannot express."""
        for section, names in (("partitions", self.partitions), ("qos", self.qos)):
            for name in names:
                if not re.fullmatch(SLURM_NAME, name):
                    yield (section, name), SLURM_NAME_RULE
        for name in self.network_env:
            if not re.fullmatch(ENV_NAME, name):
                yield ("network_env", name), "expected an environment variable name (letters, digits, _)"
        d = self.defaults
        if d.partition not in self.partitions:
            yield ("defaults", "partition"), _unknown("partition", d.partition, self.partitions)
        if d.qos not in self.qos:
            yield ("defaults", "qos"), _unknown("QOS", d.qos, self.qos)
        if d.account != "auto" and d.account not in self.accounts:
            yield ("defaults", "account"), _unknown("account", d.account, self.accounts)
        if d.preemptible_qos is not None:
            if d.preemptible_qos not in self.qos:
                yield ("defaults", "preemptible_qos"), _unknown("QOS", d.preemptible_qos, self.qos)
            elif not self.qos[d.preemptible_qos].preemptible:
                yield ("defaults", "preemptible_qos"), f"QOS {d.preemptible_qos!r} is not marked preemptible"
        for name, q in self.qos.items():
            for i, other in enumerate(q.preempts):
                if other not in self.qos:
                    yield ("qos", name, "preempts", i), _unknown("QOS", other, self.qos)
        for name in self.gpu_hour_price:
            if name not in self.partitions:
                yield ("gpu_hour_price", name), _unknown("partition", name, self.partitions)
        lo, hi = self.launch.master_port_range
        if not 1024 <= lo < hi <= 65535:
            yield (
                ("launch", "master_port_range"),
                f"expected [low, high] with 1024 <= low < high <= 65535, got [{lo}, {hi}]",
            )


def _unknown(kind: str, value: str, known: Iterable[str]) -> str:
    names = (n if re.fullmatch(SLURM_NAME, n) else repr(n) for n in sorted(known))
    return f"{kind} {value!r} is not defined in this site config (defined: {', '.join(names)})"


def site_search_path() -> list[Path]:
    """Where site names are looked up: $HPCTRAIN_SITE_DIR, ~/.config/hpctrain/sites, hpctrain's site_configs/."""
    dirs = []
    if env := os.environ.get(SITE_DIR_ENV):
        dirs.append(Path(env))
    dirs.append(Path("~/.config/hpctrain/sites").expanduser())
    dirs.append(data_dir("site_configs"))
    return dirs


SITE_SUFFIXES = (".toml", ".yaml", ".yml")


def find_site_file(site: str) -> Path:
    """A path to an existing file, or a site name looked up on the search path."""
    as_path = Path(site).expanduser()
    if as_path.suffix in SITE_SUFFIXES or os.sep in site:
        if not as_path.exists():  # one that is not a regular file is refused as it is read
            raise ConfigError(f"{site}: site config file not found")
        return as_path
    for d in site_search_path():
        for ext in SITE_SUFFIXES:
            if (candidate := d / f"{site}{ext}").is_file():
                return candidate
    searched = ", ".join(str(d) for d in site_search_path())
    raise ConfigError(f"site {site!r} not found (searched {searched})")


def default_site_name() -> str:
    return os.environ.get(SITE_ENV, "dev")


def job_site() -> SiteConfig | None:
    """In a job: the site config its batch script names ($HPCTRAIN_SITE); None elsewhere."""
    site = os.environ.get(SITE_ENV)
    return load_site(site) if site else None


class SiteGroup(StrictModel):
    """Several clusters named as one (`--site NAME`): a file found as a site config is, holding only `sites`."""

    sites: list[str] = Field(
        min_length=2, description="the site config of each cluster: a name, or a path (relative: to this file)"
    )


def site_names(site: str | None) -> list[str]:
    """The sites ``--site`` names, each once and in order: one (a name or a path), several joined by commas, or a
    site group's (`SiteGroup`)."""
    names: list[str] = []
    for part in (site or default_site_name()).split(","):
        path = find_site_file(part.strip())
        data = read_mapping(path)
        members = _members(path, validate(SiteGroup, data, path)) if "sites" in data else [part.strip()]
        names += [name for name in members if name not in names]
    return names


def _members(path: Path, group: SiteGroup) -> list[str]:
    """A group's sites, a path among them taken relative to the group's file; a group of groups refused."""
    members = []
    for member in group.sites:
        if Path(member).suffix in SITE_SUFFIXES or os.sep in member:
            member = str(path.parent / Path(member).expanduser())
        if "sites" in read_mapping(find_site_file(member)):
            raise ConfigError(f"{path}: sites: {member} is a group of sites itself: name each site of the group")
        members.append(member)
    return members


def load_site(site: str | None = None) -> SiteConfig:
    """Load a site config by name or path; $HPCTRAIN_LEDGER overrides the ledger path."""
    path = find_site_file(site or default_site_name())
    data = read_mapping(path)
    if "sites" in data:
        raise ConfigError(
            f"{path}: a group of sites, where this command takes one: name one of them "
            "(where, submit --soonest, status and cost take a group)"
        )
    cfg = validate(SiteConfig, data, path)
    cfg._source = path.resolve()
    if env := os.environ.get(LEDGER_ENV):
        cfg.ledger.path = Path(env).expanduser()
    return cfg
