"""Split a parameter list into job arrays: MaxArraySize caps the task *index*, not the count."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArrayChunk:
    """One sbatch array: tasks 0..count-1 run parameter sets offset..offset+count-1."""

    index: int
    offset: int
    count: int
    throttle: int | None

    @property
    def array_spec(self) -> str:
        return f"0-{self.count - 1}" + (f"%{self.throttle}" if self.throttle else "")


def plan_chunks(n_tasks: int, max_array_size: int, throttle: int | None) -> list[ArrayChunk]:
    """Arrays of at most ``max_array_size`` tasks (indices 0..max-1) covering ``n_tasks`` parameter sets."""
    if n_tasks < 1:
        raise ValueError("an array needs at least one task")
    return [
        ArrayChunk(i, offset, min(max_array_size, n_tasks - offset), throttle)
        for i, offset in enumerate(range(0, n_tasks, max_array_size))
    ]
