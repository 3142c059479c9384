"""A home file system on GlusterFS (scripts/gluster-home): volume ``safe`` with the options that keep SQLite whole
across clients, ``plain`` with Gluster's defaults, ``flaky`` as safe for tests whose server goes away
(`server_away`), each mounted twice (clients ``a`` and ``b``). The dev cluster's
jobs and the test process see a volume through client a; a second login host sees it through client b, bound over
a's mount point in its own mount namespace (helpers.hosts)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from helpers.paths import REPO

ROOT = Path(os.environ.get("HPCTRAIN_GLUSTER_ROOT", "/var/tmp/hpctrain-gluster"))


def gluster_up(*volumes: str) -> Path:
    """The Gluster home's root, brought up if ``volumes`` (default: safe and plain) do not answer (idempotent; one
    glusterd per machine, shared by workers; a lane sees the host's, which scripts/test brings up before the lanes
    start). Flaky's server is away while an outage test runs: only those tests look at it."""
    script = str(REPO / "scripts" / "gluster-home")
    if subprocess.run([script, "status", *(volumes or ("safe", "plain"))], capture_output=True).returncode == 0:
        return ROOT
    up = subprocess.run([script, "up"], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, f"scripts/gluster-home up failed:\n{up.stdout}\n{up.stderr}"
    return ROOT


def second_client(volume: str) -> list[tuple[Path, Path]]:
    """The binds that make a login host see ``volume`` through client b."""
    return [(ROOT / volume / "b", ROOT / volume / "a")]


def brick_running(volume: str) -> bool:
    status = subprocess.run(
        ["gluster", "--mode=script", "volume", "status", volume, "--xml"], capture_output=True, text=True
    )
    return "<status>1</status>" in status.stdout


@contextlib.contextmanager
def server_away(volume: str, back_after_s: float | None = None) -> Iterator[None]:
    """``volume``'s server (its one brick) killed, as a file server that crashed; started again after
    ``back_after_s`` (in a thread, while the block runs) or when the block ends, and waited for until its mount
    answers. Only for volume ``flaky``: others are shared by tests running at once."""
    assert volume == "flaky", "kill only the volume kept for outages"
    subprocess.run(["pkill", "-9", "-f", f"glusterfsd .*--volfile-id {volume}\\."], check=True)
    until = time.monotonic() + 30
    while brick_running(volume):
        assert time.monotonic() < until, "the brick outlived kill -9"
        time.sleep(0.2)
    timer = threading.Timer(back_after_s, _server_back, [volume]) if back_after_s is not None else None
    if timer:
        timer.start()
    try:
        yield
    finally:
        if timer:
            timer.join()
        _server_back(volume)  # a no-op where the timer's call brought it back


def _server_back(volume: str) -> None:
    subprocess.run(["gluster", "--mode=script", "volume", "start", volume, "force"], capture_output=True, check=True)
    until = time.monotonic() + 60
    while True:
        try:
            (ROOT / volume / "a").stat()
            return
        except OSError:
            assert time.monotonic() < until, f"volume {volume}'s mount did not answer again"
            time.sleep(0.2)
