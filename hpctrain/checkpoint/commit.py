"""The atomic commit: per-rank fragments as a file barrier, manifest last, one rename, fsyncs.

Files, not collectives: the commit runs on a background thread while the main thread may be in a
training collective, and two threads issuing collectives on one process group can deadlock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.manifest import NewerFormatError, merge
from hpctrain.checkpoint.naming import MANIFEST, TENSORS, ZARR_NODE, committed_name, list_dirs, trash_name
from hpctrain.checkpoint.reader import quick_check
from hpctrain.checkpoint.tree import plain_values
from hpctrain.errors import CheckpointError
from hpctrain.files import fsync_dir, write_json_atomic

log = logging.getLogger("hpctrain.checkpoint")


def write_fragment(tmp: Path, rank: int, fragment: dict[str, Any], *, mode: int) -> None:
    """Announce that this rank's writes into ``tmp`` are durable (call after they are); the file gets ``mode``."""
    write_json_atomic(tmp / f"rank-{rank}.json", {"rank": rank, **fragment}, mode, sync_dir=False)
    # The committing rank may see the fragment and rename ``tmp`` to step_<N> at once; its fsync of the
    # directory (writing the manifest into it) then makes the fragment's name durable instead.
    with contextlib.suppress(FileNotFoundError):
        fsync_dir(tmp)


def write_skip(tmp: Path, rank: int) -> None:
    """Announce that this rank skips this save, so the committing rank abandons it instead of waiting."""
    tmp.mkdir(parents=True, exist_ok=True)
    write_json_atomic(tmp / f"rank-{rank}.skip", {"rank": rank, "time": time.time()})


def write_failure(tmp: Path, rank: int, error: BaseException) -> None:
    """Announce that this rank failed to write, so the committing rank fails now rather than at its timeout."""
    tmp.mkdir(parents=True, exist_ok=True)
    write_json_atomic(tmp / f"rank-{rank}.failed", {"rank": rank, "error": str(error)})


def await_fragments(tmp: Path, world_size: int, timeout_s: float) -> list[dict[str, Any]] | None:
    """Every rank's fragment once all are there; None if a rank skipped; CheckpointError if one failed
    or on timeout."""
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        names = set(os.listdir(tmp))
        failed = sorted(n for n in names if n.endswith(".failed"))
        if failed:
            error = json.loads((tmp / failed[0]).read_text(encoding="utf-8"))["error"]
            raise CheckpointError(f"{tmp}: {failed[0].removesuffix('.failed')} failed: {error}; not committed")
        if any(n.endswith(".skip") for n in names):
            return None
        missing = [r for r in range(world_size) if f"rank-{r}.json" not in names]
        if not missing:
            return [json.loads((tmp / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(world_size)]
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"{tmp}: rank(s) {missing} did not finish writing within {timeout_s:g} s "
                "(crashed, or not calling save() for this step); not committed"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def commit(tmp: Path, fragments: list[dict[str, Any]], header: dict[str, Any], tag: str, *, mode: int) -> Path:
    """Write the fragments' merged manifest.json (last, with ``mode``), rename ``tmp`` to ``step_<N>``, fsync.

    A valid checkpoint already committed for this step wins over this one; an invalid one is discarded,
    but one of a newer format is kept and this save fails.
    """
    manifest = merge(fragments, header)
    write_groups(tmp, manifest, mode)
    write_json_atomic(tmp / MANIFEST, manifest, mode)
    step = header["step"]
    for old in (d for d in list_dirs(tmp.parent) if d.step == step):
        try:
            quick_check(old.path)
        except NewerFormatError as exc:
            discard(tmp, step, tag)
            raise CheckpointError(
                f"{exc}: not saving step {step} over a checkpoint of a newer hpctrain; upgrade hpctrain or move it away"
            ) from None
        except CheckpointError as exc:
            log.warning("replacing invalid checkpoint: %s", exc)
            discard(old.path, step, tag)
        else:
            log.warning("%s is already committed; discarding this save of step %d", old.path, step)
            discard(tmp, step, tag)
            return old.path
    final = tmp.with_name(committed_name(step))
    try:
        os.rename(tmp, final)
    except OSError as exc:
        raise CheckpointError(f"cannot commit {tmp} as {final.name}: {exc}") from exc
    fsync_dir(final.parent)
    return final


def write_groups(tmp: Path, manifest: dict[str, Any], mode: int) -> None:
    """Zarr v3 group nodes for the step directory, its tensors/ and the folders of nested names (``model/w``), so
    that `zarr.open_group(step)` lists every array. The step's attributes hold the step and the plain values of
    the lowest rank's tree (each tensor's logical dtype is in its own attributes)."""
    values = plain_values(manifest["ranks"][min(manifest["ranks"], key=int)]["tree"])
    attributes = {"hpctrain": {**{key: manifest[key] for key in ("format", "version", "step")}, "values": values}}
    nested = {parent for name in manifest["tensors"] for parent in Path(TENSORS, name).parents if parent.parts}
    for node in sorted({Path(), Path(TENSORS), *nested}):
        (tmp / node).mkdir(exist_ok=True)
        write_json_atomic(
            tmp / node / ZARR_NODE,
            {"zarr_format": 3, "node_type": "group", "attributes": {} if node.parts else attributes},
            mode,
        )


def to_trash(path: Path, step: int, tag: str) -> Path:
    """Take ``path`` out of sight atomically: rename it to trash (see ``stale_dirs``); returns the trash."""
    trash = path.with_name(trash_name(step, tag))
    os.rename(path, trash)
    fsync_dir(path.parent)
    return trash


def discard(path: Path, step: int, tag: str) -> None:
    """Take ``path`` out of sight atomically, then delete it."""
    shutil.rmtree(to_trash(path, step, tag), ignore_errors=True)


def stale_dirs(directory: Path, attempt: str, committed_step: int) -> list[Path]:
    """Trash, and the tmp directories of other attempts or of steps up to ``committed_step``, as of now.

    Tags are ``<attempt>.<save number>``; tmp directories of this attempt beyond the committed step
    may still be receiving writes from other ranks and are left alone.
    """
    return [
        d.path
        for d in list_dirs(directory, kind=None)
        if d.kind == "trash"
        or (d.kind == "tmp" and d.tag is not None and (d.tag.rpartition(".")[0] != attempt or d.step <= committed_step))
    ]


def remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
