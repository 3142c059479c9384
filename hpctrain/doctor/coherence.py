"""`hpctrain doctor --ledger`: the coherence probe (`hpctrain.ledger.coherence`) of the file system that holds the
ledger, from this host and another one: a one-task job on a compute node (srun, through the site's Slurm), or a
login host named with ``--host`` (ssh). Bounded in time; the probe file is removed whatever happens. A probe that
ran is recorded per mount (`hpctrain.ledger.probes`), where every later command finds it; one whose peer never
started, or ran on this very client, decides nothing and is not recorded.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.site import SiteConfig
from hpctrain.errors import HpctrainError
from hpctrain.files import Mount
from hpctrain.ledger.coherence import ROUNDS, TURN_S, Findings, create, lead, probe_path, verdict
from hpctrain.ledger.probes import ProbeRecord, record
from hpctrain.slurm.client import SlurmClient

START_S = 120  # srun --immediate: the peer's job starts within this, or the probe is not run
JOB_MINUTES = 5  # the peer job's time limit: a probe takes seconds, and a short job starts sooner


@dataclass(frozen=True)
class ProbeOutcome:
    """What the probe found: its verdict (None: every read fresh), and the record made of it (None: it decided
    nothing, ``detail`` says why)."""

    detail: str
    peer: str
    seconds: float
    record: ProbeRecord | None

    @property
    def passed(self) -> bool:
        return self.record is not None and self.record.passed


def peer_argv(site: SiteConfig, client: SlurmClient, probe_file: Path, host: str | None) -> tuple[list[str], str]:
    """The command that runs the peer's part, and the peer in words."""
    inner = [str(site.launch.python or sys.executable), "-m", "hpctrain.ledger.coherence", str(probe_file)]
    if host is not None:
        if not host or host.startswith("-") or any(c.isspace() for c in host):
            raise HpctrainError(f"--host {host!r}: not a host name")
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={START_S}", host, shlex.join(inner)], host
    return [
        client.executable("srun"),
        "--ntasks=1",
        "--nodes=1",
        f"--time={JOB_MINUTES}",
        f"--immediate={START_S}",
        "--job-name=hpctrain-ledger-probe",
        f"--partition={site.defaults.partition}",
        "--quiet",
        "--unbuffered",
        *inner,
    ], (f"a job on partition {site.defaults.partition}")


def _peer_findings(out: str) -> Findings | None:
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError, TypeError):
            return Findings.parse(line)
    return None


def probe(ledger: Path, mount: Mount, site: SiteConfig, host: str | None = None) -> ProbeOutcome:
    """Probe ``mount`` (the ledger's) from this host and a peer; the outcome, recorded where it decided."""
    client = SlurmClient.for_site(site)
    folder = ledger.parent
    while not folder.is_dir():  # the ledger's folder may not be made yet: the nearest one on the same mount
        folder = folder.parent
    probe_file = probe_path(folder)
    argv, peer_words = peer_argv(site, client, probe_file, host)
    begun = time.monotonic()
    create(probe_file)
    try:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=client.env()
            )
        except OSError as exc:
            return ProbeOutcome(f"the peer did not start: {argv[0]}: {exc.strerror}", peer_words, 0.0, None)
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None

        def send(line: str) -> None:
            stdin.write(line)
            stdin.flush()

        try:
            leader = lead(probe_file, send, stdout, START_S + TURN_S)
            out, err = proc.communicate(timeout=TURN_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            out, err = proc.communicate()
    finally:
        probe_file.unlink(missing_ok=True)
    seconds = time.monotonic() - begun
    peer = _peer_findings(out)
    if peer is None:
        said = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return ProbeOutcome(f"the peer did not report ({said})", peer_words, seconds, None)
    peer_words = f"{peer_words} ({peer.host})" if host is None else peer_words
    if (peer.host, peer.namespace) == (leader.host, leader.namespace):
        return ProbeOutcome(
            f"the peer ran on this host ({peer.host}), through the same client: nothing to compare",
            peer_words,
            seconds,
            None,
        )
    problem = verdict(leader, peer)
    detail = problem or f"{ROUNDS} turns on each host under the lock, every read fresh"
    return ProbeOutcome(detail, peer_words, seconds, record(mount, problem is None, detail, peer_words))
