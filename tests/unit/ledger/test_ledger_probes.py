"""The coherence probe's protocol (hpctrain.ledger.coherence) between this process and a real peer process, and its
records per mount (hpctrain.ledger.probes). Whether a real network file system passes it: the Gluster cluster test
(tests/cluster/test_ledger_gluster_cluster.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from hpctrain.config import load_site
from hpctrain.doctor.coherence import peer_argv
from hpctrain.errors import HpctrainError
from hpctrain.files import Mount
from hpctrain.ledger.coherence import PREFIX, ROUNDS, Findings, create, lead, probe_path, verdict
from hpctrain.ledger.probes import record, records_path, recorded
from hpctrain.slurm.client import SlurmClient


@pytest.fixture(autouse=True)
def state_here(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def mount(n: int) -> Mount:
    return Mount(f"/gluster/{n}", "fuse.glusterfs", f"server:/vol{n}", frozenset({"rw", "allow_other"}), (0, 40 + n))


def test_a_peer_takes_its_turns_after_the_leader_s_and_every_read_is_fresh_on_one_client(tmp_path):
    probe_file = probe_path(tmp_path)
    create(probe_file)
    peer = subprocess.Popen([sys.executable, "-m", "hpctrain.ledger.coherence", str(probe_file)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(line: str) -> None:
        peer.stdin.write(line)
        peer.stdin.flush()

    leader = lead(probe_file, send, peer.stdout, 60)
    out, _ = peer.communicate(timeout=60)
    followed = Findings.parse(out.splitlines()[-1])
    assert (leader.turns, followed.turns, leader.stale, followed.stale) == (ROUNDS, ROUNDS, 0, 0)
    assert leader.error is followed.error is None and verdict(leader, followed) is None
    assert probe_file.read_bytes().startswith(b'{"count": %d}' % (2 * ROUNDS))


def test_a_stale_read_or_a_stopped_participant_is_the_verdict():
    fresh = Findings("leader", turns=100)
    stale = Findings("peer", turns=100)
    for n in (1, 3):
        stale.stale_read(f"count {n} read where {n + 1} was written")
    stale.stale_read("count 5 read where 6 was written")
    assert verdict(fresh, stale) == ("the peer read stale data in 3 of 100 turns (such as count 1 read where 2 was "
                                     "written; count 3 read where 4 was written)")
    gone = Findings("peer", error="the other participant said nothing for 30 s")
    assert verdict(fresh, gone) == "the peer stopped: the other participant said nothing for 30 s"


def test_a_probe_file_left_by_a_killed_probe_goes_with_the_next_probe_s_start(tmp_path):
    old, recent = tmp_path / f"{PREFIX}1-1", tmp_path / f"{PREFIX}2-2"
    for path in (old, recent):
        create(path)
    os.utime(old, (0, 0))
    new = probe_path(tmp_path)
    assert not old.exists() and recent.exists() and not new.exists() and new.name.startswith(PREFIX)


def _record_one(n: int) -> None:
    for _ in range(20):
        record(mount(n), n % 2 == 0, f"probe {n}", f"login{n}")


def test_probes_recorded_at_once_are_all_kept_and_a_damaged_record_file_means_none(tmp_path):
    with ProcessPoolExecutor(4) as pool:
        list(pool.map(_record_one, range(8)))
    assert [(r.passed, r.detail) for r in map(recorded, map(mount, range(8)))] == [
        (n % 2 == 0, f"probe {n}") for n in range(8)]
    assert oct(records_path().stat().st_mode & 0o777) == "0o600"
    records_path().write_text('{"fuse.glusterfs server:/vol1": [')
    assert recorded(mount(1)) is None
    record(mount(1), True, "again", "login1")
    assert recorded(mount(1)).detail == "again" and recorded(mount(2)) is None


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/pwned", "", "two words", "-"])
def test_a_host_that_is_not_a_host_name_never_reaches_ssh(host, tmp_path):
    site = load_site("dev")
    with pytest.raises(HpctrainError, match="not a host name"):
        peer_argv(site, SlurmClient.for_site(site), tmp_path / "p", host)


def test_the_peer_is_a_one_task_job_or_ssh_with_the_path_quoted(tmp_path):
    site = load_site("dev")
    probe_file = tmp_path / "odd dir; $(x)" / "p"
    argv, words = peer_argv(site, SlurmClient.for_site(site), probe_file, "login2")
    assert argv[:-1] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=120", "login2"] and words == "login2"
    assert argv[-1].endswith(f"-m hpctrain.ledger.coherence '{probe_file}'")
    argv, words = peer_argv(site, SlurmClient.for_site(site), probe_file, None)
    assert argv[0].endswith("srun") and "--ntasks=1" in argv and f"--partition={site.defaults.partition}" in argv
    assert argv[-1] == str(probe_file) and words == f"a job on partition {site.defaults.partition}"
