"""A rank's heartbeat file (hpctrain.runtime.heartbeat): the shim's memfd, written by the rank through /proc and read
back by the shim; a path that is not such a memfd (another PID namespace's process, a stale variable) is never
written."""

import os
import time

from hpctrain.runtime.heartbeat import Heartbeat, create, read


def test_the_rank_writes_the_deadline_the_shim_reads():
    fd, path = create()
    assert read(fd) is None  # no beat yet
    beat = Heartbeat.open(path)
    deadline = time.monotonic() + 5
    beat.write(deadline, "step")
    assert read(fd).phase == "step" and abs(read(fd).deadline - deadline) < 0.001
    beat.write(0, "")
    assert read(fd).deadline == 0
    beat.close()
    os.close(fd)


def test_a_path_that_is_not_the_shims_memfd_is_left_alone(tmp_path):
    other = tmp_path / "someone's file"
    other.write_text("keep me")
    assert Heartbeat.open(other) is None
    with other.open() as f:
        assert Heartbeat.open(f"/proc/{os.getpid()}/fd/{f.fileno()}") is None
    assert Heartbeat.open(tmp_path / "missing") is None
    assert other.read_text() == "keep me"
