"""Async saves' copy modes: copying while training goes on, handing tensors over, and catching a change
made while a save still reads a tensor instead of committing a state torn between two steps."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import hpctrain.checkpoint.checkpointer as checkpointer_module
from hpctrain.checkpoint import Checkpointer, latest_valid, load
from hpctrain.errors import CheckpointError

from helpers.checkpoint import same_bits


class GatedPool(ThreadPoolExecutor):
    """A copy pool whose tasks start only once ``gate`` is set: a copy caught in the middle."""

    def __init__(self, gate: threading.Event):
        super().__init__(2)
        self.gate = gate

    def submit(self, fn, *args):
        return super().submit(lambda: self.gate.wait(30) and fn(*args))


@pytest.fixture
def held_writes(monkeypatch):
    """Writes of chunk files wait until the returned event is set."""
    release, real = threading.Event(), checkpointer_module.write_pieces

    def held(root, pieces):
        release.wait(30)
        return real(root, pieces)

    monkeypatch.setattr(checkpointer_module, "write_pieces", held)
    return release


def saved_w(directory, step):
    return load(directory / f"step_{step:08d}", to="torch")["w"]


def test_background_copy_lets_training_change_the_state_once_copied_while_the_write_is_held(tmp_path, held_writes):
    w = torch.arange(1000, dtype=torch.float32)
    with Checkpointer(tmp_path, journal=None) as ck:
        future = ck.save(1, {"w": w}, async_=True, copy="background")
        ck.wait_snapshot()  # returns with the write still held back
        assert not future.done()
        w.add_(1)  # the optimizer step
        held_writes.set()
        assert future.result(30) == tmp_path / "step_00000001"
    assert same_bits(saved_w(tmp_path, 1), torch.arange(1000, dtype=torch.float32))


def test_a_change_during_a_background_copy_fails_the_save_naming_the_tensor(tmp_path):
    w, b = torch.zeros(1000), torch.ones(3)
    with Checkpointer(tmp_path, journal=None) as ck:
        ck.save(1, {"w": w, "b": b}, async_=True)
        gate = threading.Event()
        ck._buffers._pool = GatedPool(gate)
        ck.save(2, {"w": w, "b": b}, async_=True, copy="background")
        w.add_(1)  # forgot wait_snapshot()
        gate.set()
        with pytest.raises(CheckpointError, match="tensor 'w' was changed in place while an async save was copying"):
            ck.wait()
    assert latest_valid(tmp_path) == tmp_path / "step_00000001"
    assert same_bits(saved_w(tmp_path, 1), torch.zeros(1000))


def test_handed_over_tensors_are_written_without_a_copy_and_a_change_meanwhile_fails_the_save(tmp_path, held_writes):
    fresh, kept = torch.arange(10, dtype=torch.float32), torch.ones(4)
    with Checkpointer(tmp_path, journal=None) as ck:
        future = ck.save(1, {"w": fresh}, async_=True, copy="none")
        held_writes.set()
        future.result(30)
        held_writes.clear()
        ck.save(2, {"w": kept}, async_=True, copy="none")
        kept.mul_(2)
        held_writes.set()
        with pytest.raises(CheckpointError, match="tensor 'w' was changed in place while an async save .copy='none'"):
            ck.wait()
    assert latest_valid(tmp_path) == tmp_path / "step_00000001"
    assert same_bits(saved_w(tmp_path, 1), torch.arange(10, dtype=torch.float32))


def test_copy_mode_is_checked(tmp_path):
    with Checkpointer(tmp_path, journal=None) as ck, pytest.raises(ValueError, match="copy must be one of"):
        ck.save(1, {"w": torch.ones(1)}, async_=True, copy="later")
