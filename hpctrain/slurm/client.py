"""The one door to Slurm: every command hpctrain runs against the cluster goes through here.

Slurm 22.05 has no usable Python binding here (pyslurm has no release for it), so this drives
the CLI tools with machine-readable output. Calls are counted per command so tests and the
benchmarks can prove hpctrain spares the controller.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.errors import SlurmError, SlurmTimeout
from hpctrain.slurm.parse import (
    Parsable,
    parse_kv_lines,
    parse_parsable,
    parse_parsable_with_header,
    parse_test_only,
)
from hpctrain.slurm.version import SlurmFeatures, SlurmVersion

if TYPE_CHECKING:
    from hpctrain.config.site import SiteConfig

CLIENT_COMMANDS = ("sbatch", "squeue", "sacct", "sinfo", "scontrol", "sacctmgr", "sshare", "scancel")


# An update of a whole array is refused by its tasks that have started or ended (scontrol then fails, every
# other task answering "No error"): they need none.
TASKS_ENDED = re.compile(r"^\S+: (No error|Job has already finished|Job is no longer pending execution)$")
# A cancel of a job or task that ended meanwhile (or left the controller's memory): nothing is left to do.
SLURM_NODE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}"  # a node's name: never an option
CANCEL_ENDED = re.compile(
    r"^scancel: error: Kill job error on job id \S+: (Job/step already completing or completed|Invalid job id specified)$"
)


TIME_FORMAT = "SLURM_TIME_FORMAT"  # how Slurm's commands print times: a user's own would hide every time read


def calling_job_variables(environ: Mapping[str, str]) -> list[str]:
    """The names of the SLURM_* variables Slurm set for the job this process runs in (none outside a job)."""
    if "SLURM_JOB_ID" not in environ:
        return []
    return [name for name in environ if name.startswith("SLURM_") and name != "SLURM_CONF"]


class SlurmClient:
    def __init__(self, conf: Path | None = None, bin_dir: Path | None = None, timeout_s: float = 60.0):
        self.conf = conf
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s
        self.calls: Counter[str] = Counter()
        self._features: SlurmFeatures | None = None

    @classmethod
    def for_site(cls, site: SiteConfig) -> SlurmClient:
        return cls(site.slurm.conf, site.slurm.bin_dir, site.slurm.timeout_s)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf is not None:
            env["SLURM_CONF"] = str(self.conf)
        return env

    def executable(self, command: str) -> str:
        return str(self.bin_dir / command) if self.bin_dir else command

    def run(
        self,
        command: str,
        *args: str,
        input: str | None = None,
        extra_env: dict[str, str] | None = None,
        unset_env: Iterable[str] = (),
        harmless: re.Pattern[str] | None = None,
        answer_on_stderr: bool = False,
    ) -> str:
        """Run one Slurm command; its stdout (its stderr with ``answer_on_stderr``), or SlurmError with the first
        line of its complaint. ``extra_env`` adds to the command's environment, names in ``unset_env`` are taken out
        of it. A failure whose every complaint line matches ``harmless`` is none."""
        self.calls[command] += 1
        argv = [self.executable(command), *args]
        env = {**self.env(), TIME_FORMAT: "standard", **(extra_env or {})}  # every time in an answer read as ISO
        for name in unset_env:
            env.pop(name, None)
        if (conf := env.get("SLURM_CONF")) and not Path(conf).exists():
            # Slurm retries a configuration file it is given for a minute before it fails; one it is not given it
            # looks for itself (its default, then slurmd's configless copy and the controller's DNS record).
            named = "the site config's slurm.conf" if self.conf is not None else "$SLURM_CONF"
            raise SlurmError(f"{command}: Slurm's configuration file {conf} ({named}) does not exist")
        # The answer goes to a file, read at once: a pipe is read a few hundred bytes per wake-up, which for
        # sacct's thousands of rows cost more than parsing them.
        with tempfile.TemporaryFile() as answer:
            try:
                proc = subprocess.run(
                    argv,
                    input=input,
                    stdout=answer,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    timeout=self.timeout_s,
                )
            except FileNotFoundError:
                raise SlurmError(
                    f"{command}: command not found (is this a Slurm login node? set slurm.bin_dir)"
                ) from None
            except subprocess.TimeoutExpired:
                raise SlurmTimeout(f"{command}: no answer within {self.timeout_s:g}s (is slurmctld up?)") from None
            answer.seek(0)
            stdout = answer.read().decode(errors="replace")
        said = (proc.stderr or stdout).splitlines()
        if proc.returncode < 0 and not said:  # a signal ended it before it could say anything
            by = next((s.name for s in signal.Signals if s == -proc.returncode), f"signal {-proc.returncode}")
            raise SlurmError(f"{command} {' '.join(args[:3])}: killed by {by}")
        if proc.returncode != 0 and not (harmless and said and all(harmless.match(ln) for ln in said)):
            raise SlurmError(f"{command} {' '.join(args[:3])}: {complaint(proc.stderr or stdout)}")
        return proc.stderr if answer_on_stderr else stdout

    # Queries used across hpctrain. Each is exactly one command run.

    def ping(self) -> str:
        """The 'UP' line of `scontrol ping`; SlurmError when the controller is down."""
        return self.run("scontrol", "ping").strip()

    def version(self) -> SlurmVersion:
        """The controller's release (SLURM_VERSION of `scontrol show config`): it decides how jobs are treated."""
        return self.features().version

    def features(self) -> SlurmFeatures:
        """What the controller's release and configuration offer; read once per client."""
        if self._features is None:
            self._features = SlurmFeatures.from_config(self.config())
        return self._features

    def config(self) -> dict[str, str]:
        """`scontrol show config` as a dict."""
        conf: dict[str, str] = {}
        for line in self.run("scontrol", "show", "config").splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith(" "):
                conf[key.strip()] = value.strip()
        return conf

    def show(self, entity: str) -> list[dict[str, str]]:
        """`scontrol -o show <entity>` (partition, node, job, ...) as one dict per record."""
        return parse_kv_lines(self.run("scontrol", "-o", "show", entity))

    def show_job(self, target: str) -> dict[str, str]:
        """`scontrol -o show job TARGET` for one job or one array task (``<array>_<task>``)."""
        records = parse_kv_lines(self.run("scontrol", "-o", "show", "job", target))
        if len(records) != 1:
            raise SlurmError(f"scontrol show job {target}: expected one record, got {len(records)}")
        return records[0]

    def assoc_mgr(self, accounts: list[str], user: str, qos: list[str] | None = None) -> str:
        """`scontrol show assoc_mgr` for ``accounts`` (their own rows and ``user``'s) and ``qos`` (None: no
        QOS records): every limit with what is in use against it (see hpctrain.slurm.assoc_mgr)."""
        wanted = [f"qos={','.join(qos)}", "flags=assoc,qos"] if qos is not None else ["flags=assoc"]
        return self.run("scontrol", "show", "assoc_mgr", f"accounts={','.join(accounts)}", f"users={user}", *wanted)

    def requeue(self, target: str) -> None:
        """`scontrol requeue TARGET`: a job, or only one task of an array (``<array>_<task>``)."""
        self.run("scontrol", "requeue", target)

    def exclude_nodes(self, target: str, nodes: list[str]) -> None:
        """Keep a job's next runs off ``nodes`` (its ExcNodeList; Slurm takes it while the job is pending or
        being requeued, not while it runs)."""
        self.run("scontrol", "update", f"JobId={target}", f"ExcNodeList={','.join(nodes)}")

    def set_array_throttle(self, target: str, throttle: int, dependency: str | None = None) -> None:
        """An array's ArrayTaskThrottle; ``dependency`` replaces what it waits for ('': nothing) when given."""
        self.run(
            "scontrol",
            "update",
            f"JobId={target}",
            f"ArrayTaskThrottle={throttle}",
            *([f"Dependency={dependency}"] if dependency is not None else []),
            harmless=TASKS_ENDED,
        )

    def node_states(self, nodes: list[str]) -> dict[str, str]:
        """Each node's state as sinfo's %T spells it: 'allocated', 'mixed', 'drained', 'down*' ('*': not
        responding)."""
        out = self.run("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T")
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def find_by_comment(self, comment: str) -> str | None:
        """The id of this user's job (an array's own id) whose comment is ``comment``, if the controller has one."""
        for line in self.run("squeue", "-h", "--me", "-t", "all", "-o", "%i|%k").splitlines():
            slurm_id, _, text = line.partition("|")
            if text == comment:
                return slurm_id.split("_")[0]
        return None

    def find_by_name(self, name: str, since: float) -> str | None:
        """The id of this user's job named ``name`` submitted since ``since`` (epoch seconds): the controller's,
        else accounting's once the controller has forgotten it; None where neither has one."""
        for line in self.run("squeue", "-h", "--me", "-t", "all", "--name", name, "-o", "%i").split():
            return line.split("_")[0]
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
        for line in self.run("sacct", "-X", "-n", "-P", "--name", name, "-S", start, "-o", "JobID").split():
            return line.split("_")[0]
        return None

    def sacctmgr(self, entity: str, *conditions: str, fields: str) -> list[dict[str, str]]:
        """`sacctmgr -n -P show <entity> ... format=<fields>` as dicts keyed by the field names."""
        out = self.run("sacctmgr", "-n", "-P", "show", entity, *conditions, f"format={fields}")
        return parse_parsable(out, fields.split(","))

    def sshare(self, user: str) -> list[dict[str, str]]:
        """Fairshare standing of every account and of ``user``'s associations, by column name."""
        out = self.run(
            "sshare",
            "--parsable2",
            "-a",
            "-u",
            user,
            "-o",
            "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare,LevelFS",
        )
        return parse_parsable_with_header(out)

    def sbatch(
        self, script: str, env: dict[str, str] | None = None, args: tuple[str, ...] = (), unset_env: Iterable[str] = ()
    ) -> str:
        """Submit ``script`` (sent on stdin); returns the job id. ``env`` adds to the submitting environment,
        names in ``unset_env`` are taken out of it: with --export=ALL Slurm keeps what sbatch inherits. Submitted
        from inside a job (a scrontab tick, a job submitting itself again), none of that job's SLURM_* variables
        but SLURM_CONF is passed on: the new job would read what Slurm does not set for it (SLURM_RESTART_COUNT,
        SLURM_ARRAY_JOB_ID, SLURM_MEM_PER_CPU, ...) as its own."""
        unset = [*unset_env, *calling_job_variables(os.environ)]
        if TIME_FORMAT in os.environ:  # the job's environment is the user's, not the one hpctrain reads answers in
            env = {TIME_FORMAT: os.environ[TIME_FORMAT], **(env or {})}
        else:
            unset.append(TIME_FORMAT)
        out = self.run("sbatch", "--parsable", *args, input=script, extra_env=env, unset_env=unset)
        return out.strip().split(";")[0]

    def test_only(self, script: str, unset_env: Iterable[str] = ()) -> tuple[float, str]:
        """When and where Slurm would start ``script`` now (`sbatch --test-only`: nothing is submitted): the start
        (a timestamp) and the nodes. SlurmError when it would refuse the job or gives no estimate."""
        unset = [*unset_env, *calling_job_variables(os.environ)]
        said = self.run("sbatch", "--test-only", input=script, unset_env=unset, answer_on_stderr=True)
        found = parse_test_only(said)
        if found is None:
            raise SlurmError(f"sbatch --test-only: no start estimate in its answer: {complaint(said)}")
        at, nodes, _ = found
        return datetime.datetime.fromisoformat(at).timestamp(), nodes

    def sacct(self, job_ids: list[str], fields: tuple[str, ...]) -> Sequence[dict[str, str]]:
        """One `sacct -X -D` call for all ``job_ids``: one row per allocation attempt, array tasks expanded."""
        if not job_ids:
            return []
        out = self.run("sacct", "-X", "-D", "--parsable2", "--format=" + ",".join(fields), "-j", ",".join(job_ids))
        return Parsable.of(out)

    def squeue_states(self, job_ids: list[str]) -> list[dict[str, str]]:
        """The controller's view when accounting is down: one `squeue` call, array tasks expanded, rows
        shaped like sacct's (JobID, State) for the jobs it still holds."""
        state_only = ("--only-job-state",) if self.features().version.has_only_job_state else ()
        out = self.run("squeue", *state_only, "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(job_ids))
        return [dict(zip(("JobID", "State"), line.split("|"))) for line in out.splitlines() if "|" in line]

    def steps(self, job_id: str) -> list[str]:
        """The running steps of a job, as ``<job>.<step>`` (one `squeue` call)."""
        return self.run("squeue", "-h", "-s", "-o", "%i", "-j", job_id).split()

    def pending_reasons(self, job_ids: list[str]) -> dict[str, str]:
        """Why each pending job (or array task, ``<array>_<task>``) of ``job_ids`` waits, as the controller
        says it (one `squeue` call; sacct does not say it on every release)."""
        out = self.run("squeue", "-h", "-r", "-t", "PENDING", "-o", "%i|%r", "-j", ",".join(job_ids))
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def on_node(self, node: str, partition: str, argv: list[str], minutes: int = 5, start_s: int = 120) -> str:
        """Run ``argv`` as a one-task job step on ``node`` (srun, a job of its own that must start within
        ``start_s``); its stdout."""
        if not re.fullmatch(SLURM_NODE, node):
            raise SlurmError(f"{node!r}: not a node name")
        return self.run(
            "srun",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            f"--time={minutes}",
            f"--immediate={start_s}",
            f"--partition={partition}",
            "--job-name=hpctrain-on-node",
            "--quiet",
            "--",
            *argv,
        )

    def scancel(
        self,
        job_ids: list[str],
        signal: str | None = None,
        batch_only: bool = False,
        harmless: re.Pattern[str] | None = None,
    ) -> None:
        if not job_ids:
            return
        args = ([f"--signal={signal}"] if signal else []) + (["--batch"] if batch_only else [])
        self.run("scancel", *args, *job_ids, harmless=harmless)


def complaint(text: str, limit: int = 400) -> str:
    """A Slurm command's complaint on one line: its error lines (all of them: sbatch names the limit on
    one and the refusal on the next) joined, each command prefix said once; at most ``limit`` characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()] or lines[:1]
    if not errors:
        return "failed with no message"
    parts = [errors[0]] + [re.sub(r"^\S+: error: ", "", ln) for ln in errors[1:]]
    joined = "; ".join(dict.fromkeys(parts))
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."
