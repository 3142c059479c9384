"""The checkpoint filesystem full in the middle of a save: a clear error, and the previous checkpoint stays
the newest valid one, intact."""

import shutil
import subprocess

import pytest
import torch

from hpctrain.checkpoint import Checkpointer, latest_valid, load_flat
from hpctrain.errors import CheckpointError


@pytest.fixture
def small_fs(tmp_path):
    """A 6 MiB filesystem (tmpfs; needs root, as CI runs)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6M", "tmpfs", str(mount)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a size-limited tmpfs here (not root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_fails_the_save_clearly_and_keeps_the_previous_checkpoint(small_fs):
    small = {"w": torch.arange(64 * 1024, dtype=torch.float32)}  # 256 KiB
    big = {"w": torch.randn(8 * 256 * 1024)}  # 8 MiB: more than the filesystem holds
    ck = Checkpointer(small_fs, rank=0, world_size=1)
    ck.save(10, small)
    with pytest.raises(CheckpointError, match="No space left on device") as failed:
        ck.save(20, big)
        ck.close()
    assert str(failed.value).startswith("writing tensor 'w' into ") and len(str(failed.value).splitlines()) == 1
    newest = latest_valid(small_fs, full=True)
    assert newest is not None and newest.name == "step_00000010"
    assert torch.equal(load_flat(newest)["w"], small["w"])
