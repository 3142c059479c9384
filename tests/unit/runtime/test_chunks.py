"""A throttle across the chunks of an array split past MaxArraySize (hpctrain.runtime.chunks), without Slurm:
Slurm's side is a recorder of the throttles set and a scheduler that starts what they allow."""

from __future__ import annotations

import json
import random

import pytest

from hpctrain.contract import JobPaths
from hpctrain.runtime.chunks import Chunk, ChunkTable, add_chunk, start_table, task_ended
from hpctrain.submit.arrays import plan_chunks


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str | None]] = []

    def set_array_throttle(self, target: str, throttle: int, dependency: str | None = None) -> None:
        self.calls.append((target, throttle, dependency))


def submitted(tmp_path, n_tasks: int, size: int, throttle: int, slurm: Recorder) -> JobPaths:
    paths = JobPaths(tmp_path)
    start_table(paths, throttle, singleton=False)
    for c in plan_chunks(n_tasks, size, throttle):
        add_chunk(paths, Chunk(f"{100 + c.index}", c.offset, c.count, throttle if c.index == 0 else 0), slurm)
    return paths


def test_each_chunk_may_run_what_the_chunks_before_leave():
    table = ChunkTable(4, False, [Chunk(str(i), 5 * i, 5, 0) for i in range(4)] + [Chunk("4", 20, 3, 0)])
    assert table.allowances(table.left()) == [4, 0, 0, 0, 0]
    table.ended |= {0, 1, 3}
    assert table.allowances(table.left()) == [4, 2, 0, 0, 0]
    table.ended |= {2, 4, 5, 6, 7, 8}
    assert table.allowances(table.left()) == [4, 4, 3, 0, 0]


def test_a_release_waits_for_the_tasks_still_exiting_and_only_grows(tmp_path):
    slurm = Recorder()
    paths = submitted(tmp_path, 12, 5, 3, slurm)
    assert slurm.calls == []
    for task in (0, 1):
        task_ended(paths, task, f"100_{task}", slurm)
    assert slurm.calls == []  # three of chunk 0 left: no room yet
    task_ended(paths, 2, "100_2", slurm)
    assert slurm.calls == [("101", 1, "afterany:100_0:100_1:100_2")]
    task_ended(paths, 4, "100_4", slurm)
    assert slurm.calls[1:] == [("101", 2, "afterany:100_0:100_1:100_2:100_4")]
    assert json.loads(paths.chunks_file.read_text())["ended"] == [0, 1, 2, 4]


def test_a_task_that_ended_before_its_chunk_was_added_still_counts(tmp_path):
    slurm, paths = Recorder(), JobPaths(tmp_path)
    start_table(paths, 2, singleton=True)
    add_chunk(paths, Chunk("100", 0, 2, 2), slurm)
    task_ended(paths, 0, "100_0", slurm)
    add_chunk(paths, Chunk("101", 2, 2, 0), slurm)
    assert slurm.calls == [("101", 1, "afterany:100_0,singleton")]


def test_no_table_no_calls(tmp_path):
    slurm = Recorder()
    task_ended(JobPaths(tmp_path), 3, "7_3", slurm)
    assert slurm.calls == [] and not JobPaths(tmp_path).chunks_file.exists()


@pytest.mark.parametrize("seed", range(5))
def test_the_throttle_is_always_full_and_never_exceeded(tmp_path, seed):
    """Tasks end in a random order; after each, Slurm starts what the throttles allow: min(T, tasks left) run."""
    throttle, rng, slurm = 4, random.Random(seed), Recorder()
    paths = submitted(tmp_path, 23, 5, throttle, slurm)
    chunks = plan_chunks(23, 5, throttle)
    allowed = {c.index: throttle if c.index == 0 else 0 for c in chunks}
    pending = {c.index: list(range(c.offset, c.offset + c.count)) for c in chunks}
    running: dict[int, set[int]] = {c.index: set() for c in chunks}

    def schedule() -> None:
        for target, value, _ in slurm.calls:
            allowed[int(target) - 100] = value
        for j, tasks in pending.items():
            while tasks and len(running[j]) < allowed[j]:
                running[j].add(tasks.pop(0))

    schedule()
    left = 23
    while left:
        assert sum(map(len, running.values())) == min(throttle, left)
        j = rng.choice([j for j, r in running.items() if r])
        task = rng.choice(sorted(running[j]))
        running[j].discard(task)
        left -= 1
        task_ended(paths, task, f"{100 + j}_{task}", slurm)
        schedule()
    assert not any(pending.values())


def test_a_chunk_never_waits_for_its_own_tasks_nor_asks_for_more_than_it_has_left():
    table = ChunkTable(4, False, [Chunk("100", 0, 2, 4), Chunk("101", 2, 3, 2)], ended={0, 1, 2},
                       exiting={"100_1": 0.0, "101_0": 0.0})
    slurm = Recorder()
    table.release(slurm)
    assert slurm.calls == []  # two left, throttle two already: the room of four is not asked for
    table.chunks[1].released = 1
    table.release(slurm)
    assert slurm.calls == [("101", 2, "afterany:100_1")]
