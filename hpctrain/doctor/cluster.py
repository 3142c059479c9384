"""The site config against the live cluster: controller, partitions, GPUs, accounts, QOS, preemption, ledger and
paths, one verdict per check."""

from __future__ import annotations

import getpass
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from hpctrain.config.site import SiteConfig
from hpctrain.errors import HpctrainError
from hpctrain.files import Mount, mount_of
from hpctrain.ledger import Ledger
from hpctrain.ledger.storage import is_local, locks_only_this_host
from hpctrain.slurm.client import CLIENT_COMMANDS, SlurmClient
from hpctrain.slurm.parse import gpus_in_gres
from hpctrain.slurm.version import SlurmFeatures

Verdict = Literal["PASS", "WARN", "FAIL", "SKIP"]


@dataclass
class Check:
    name: str
    verdict: Verdict
    detail: str


class Doctor:
    """Runs the checks; Slurm queries are made once each and shared between checks."""

    def __init__(self, site: SiteConfig, client: SlurmClient | None = None):
        self.site = site
        self.client = client or SlurmClient.for_site(site)
        self.user = getpass.getuser()

    def run(self) -> list[Check]:
        checks = [self._commands()]
        controller = self._guard("controller", self._controller)
        checks.append(controller)
        cluster_checks: list[tuple[str, Callable[[], Iterable[Check]]]] = [
            ("slurm version", lambda: [self._version()]),
            ("accounting", lambda: [self._accounting()]),
            ("partitions", self._partitions),
            ("accounts", self._accounts),
            ("qos", self._qos),
            ("preemption", self._preemption),
            ("array size", lambda: [self._array_size()]),
        ]
        for name, fn in cluster_checks:
            if controller.verdict == "FAIL":
                checks.append(Check(name, "SKIP", "controller unreachable"))
                continue
            try:
                checks.extend(fn())
            except HpctrainError as exc:
                checks.append(Check(name, "FAIL", str(exc)))
        checks.extend(self.ledger_checks())
        checks.extend(self._paths())
        return checks

    def ledger_checks(self, host: str | None = None) -> list[Check]:
        """The coherence probe of the ledger's file system where it is not a local disk (the peer: login host
        ``host``, else a job on a compute node), then the ledger itself."""
        path = self.site.ledger.path
        mount = mount_of(path)
        checks = []
        if mount is not None and not is_local(mount) and locks_only_this_host(mount) is None:
            checks.append(self._guard("ledger probe", lambda: self._probe(path, mount, host)))
        return [*checks, self._guard("ledger", self._ledger)]

    def _probe(self, path: Path, mount: Mount, host: str | None) -> Check:
        from hpctrain.doctor.coherence import probe

        outcome = probe(path, mount, self.site, host)
        said = f"{mount.fstype} {mount.source} with {outcome.peer}, {outcome.seconds:.1f} s: {outcome.detail}"
        if outcome.record is None:
            return Check("ledger probe", "WARN", f"decided nothing: {said}")
        return Check("ledger probe", "PASS" if outcome.passed else "FAIL", f"{said} (recorded)")

    def _guard(self, name: str, fn: Callable[[], Check]) -> Check:
        try:
            return fn()
        except HpctrainError as exc:
            return Check(name, "FAIL", str(exc))

    def _commands(self) -> Check:
        missing = [c for c in CLIENT_COMMANDS if not shutil.which(self.client.executable(c))]
        if missing:
            return Check("slurm commands", "FAIL", f"not found: {', '.join(missing)}")
        return Check("slurm commands", "PASS", f"{len(CLIENT_COMMANDS)} found")

    def _controller(self) -> Check:
        return Check("controller", "PASS", self.client.ping())

    def _version(self) -> Check:
        """The controller's release, and what hpctrain does differently because of it."""
        features = SlurmFeatures.from_config(self._config)  # as SlurmClient.features(), from the cached config
        supported = features.version.at_least(22, 5)
        return Check(
            "slurm version",
            "PASS" if supported else "WARN",
            f"{features.version}: {'; '.join(features.notes())}"
            + ("" if supported else "; hpctrain is tested on 22.05+"),
        )

    def _accounting(self) -> Check:
        clusters = [r["cluster"] for r in self.client.sacctmgr("cluster", fields="cluster")]
        name = self._config.get("ClusterName", "?")
        if name not in clusters:
            return Check(
                "accounting", "FAIL", f"cluster {name!r} is not registered in slurmdbd (has: {', '.join(clusters)})"
            )
        return Check("accounting", "PASS", f"slurmdbd knows cluster {name!r}")

    @cached_property
    def _config(self) -> dict[str, str]:
        return self.client.config()

    def _partitions(self) -> Iterable[Check]:
        parts = {p["PartitionName"]: p for p in self.client.show("partition")}
        nodes = self.client.show("node")
        for name, want in self.site.partitions.items():
            label = f"partition {name}"
            got = parts.get(name)
            if got is None:
                yield Check(
                    label,
                    "FAIL",
                    f"partition {name!r} (partitions.{name}) does not exist on the cluster (has: {', '.join(sorted(parts))})",
                )
                continue
            members = [n for n in nodes if name in n.get("Partitions", "").split(",")]
            gpus = {n["NodeName"]: gpus_in_gres(n.get("Gres", "")) for n in members}
            short = sorted(n for n, g in gpus.items() if g < want.gpus_per_node)
            problems, notes = [], []
            if short:
                problems.append(
                    f"site config says {want.gpus_per_node} GPUs per node (partitions.{name}.gpus_per_node), "
                    f"but {', '.join(short)} have {min(gpus[n] for n in short)}"
                )
            if got.get("State") != "UP":
                notes.append(f"state {got.get('State')}")
            if want.nodes is not None and want.nodes != len(members):
                notes.append(f"site config says {want.nodes} nodes, cluster has {len(members)}")
            detail = f"{len(members)} nodes, {min(gpus.values(), default=0)} GPUs per node"
            if problems:
                yield Check(label, "FAIL", "; ".join(problems))
            elif notes:
                yield Check(label, "WARN", f"{detail}; " + "; ".join(notes))
            else:
                yield Check(label, "PASS", detail)

    def _accounts(self) -> Iterable[Check]:
        existing = {r["account"] for r in self.client.sacctmgr("account", fields="account")}
        mine = {r["account"] for r in self.client.sacctmgr("assoc", f"user={self.user}", fields="account,user")}
        missing = [a for a in self.site.accounts if a not in existing]
        if missing:
            yield Check(
                "accounts",
                "FAIL",
                f"account(s) {', '.join(map(repr, missing))} named in the site config (accounts) do not exist on the cluster (has: {', '.join(sorted(existing))})",
            )
            return
        outside = [a for a in self.site.accounts if a not in mine]
        if len(outside) == len(self.site.accounts):
            yield Check(
                "accounts",
                "FAIL",
                f"user {self.user!r} belongs to none of the site's accounts ({', '.join(self.site.accounts)})",
            )
        elif outside:
            yield Check("accounts", "WARN", f"user {self.user!r} is not in {', '.join(outside)}")
        else:
            yield Check("accounts", "PASS", f"user {self.user!r} in {', '.join(self.site.accounts)}")

    @cached_property
    def _cluster_qos(self) -> dict[str, dict[str, str]]:
        rows = self.client.sacctmgr("qos", fields="name,preempt,preemptmode,gracetime")
        return {r["name"]: r for r in rows}

    def _qos(self) -> Iterable[Check]:
        cluster = self._cluster_qos
        missing = [q for q in self.site.qos if q not in cluster]
        for q in missing:
            yield Check(
                "qos",
                "FAIL",
                f"QOS {q!r} named in the site config (qos.{q}) does not exist on the cluster (has: {', '.join(sorted(cluster))})",
            )
        if not missing:
            yield Check("qos", "PASS", ", ".join(self.site.qos))

    def _preemption(self) -> Iterable[Check]:
        cluster, conf = self._cluster_qos, self._config
        preempt_type = conf.get("PreemptType", "preempt/none")
        problems, warnings = [], []
        for name, q in self.site.qos.items():
            if name not in cluster:
                continue
            if q.preemptible:
                if preempt_type == "preempt/none":
                    problems.append(f"QOS {name!r} is marked preemptible but PreemptType=preempt/none")
                by = [other for other, r in cluster.items() if name in r["preempt"].split(",")]
                if preempt_type == "preempt/qos" and not by:
                    problems.append(
                        f"QOS {name!r} is marked preemptible (qos.{name}.preemptible) but no QOS preempts it"
                    )
                mode = cluster[name]["preemptmode"]
                mode = conf.get("PreemptMode", "OFF") if mode == "cluster" else mode
                if "REQUEUE" not in mode.upper():
                    problems.append(f"QOS {name!r} preempts by {mode}, not REQUEUE: preempted jobs would be lost")
            for victim in q.preempts:
                if victim in cluster and victim not in cluster[name]["preempt"].split(","):
                    warnings.append(f"site config says {name!r} preempts {victim!r}, the cluster does not")
        if "preempt_send_user_signal" not in conf.get("SlurmctldParameters", ""):
            warnings.append(
                "SlurmctldParameters lacks preempt_send_user_signal: preempted jobs get SIGTERM only (handled)"
            )
        relation = "; ".join(f"{n} preempts {r['preempt']}" for n, r in cluster.items() if r["preempt"]) or "none"
        if problems:
            yield Check("preemption", "FAIL", "; ".join(problems))
        elif warnings:
            yield Check("preemption", "WARN", "; ".join(warnings))
        else:
            yield Check("preemption", "PASS", f"{preempt_type}, {relation}")

    def _array_size(self) -> Check:
        actual = self._config.get("MaxArraySize", "?")
        configured = self.site.slurm.max_array_size
        if configured is not None and str(configured) != actual:
            return Check(
                "array size", "WARN", f"site config says max_array_size={configured}, cluster MaxArraySize={actual}"
            )
        return Check("array size", "PASS", f"MaxArraySize={actual}")

    def _ledger(self) -> Check:
        path = self.site.ledger.path
        with Ledger(path) as ledger:
            with ledger.transaction():  # takes the write lock: proves the file is writable
                pass
            version = ledger.schema_version
        return Check("ledger", "PASS", f"{path} (schema v{version}; {ledger.storage.describe()})")

    def _paths(self) -> Iterable[Check]:
        for key, path in self.site.paths:
            if not path.is_dir():
                yield Check(f"paths.{key}", "WARN", f"{path} does not exist")
            elif not os.access(path, os.W_OK | os.X_OK):
                yield Check(f"paths.{key}", "WARN", f"{path} is not writable by {self.user}")
            else:
                yield Check(f"paths.{key}", "PASS", str(path))
