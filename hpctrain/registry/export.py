"""Hand a version on: its checkpoint (checksums verified, unchanged since registration) written to a new folder
as one weights file (safetensors or torch), a manifest (the version, its lineage and evaluation results, each
file's sha256) and, for the reference GPT, ``config.json`` and ``modeling.py`` that load it in plain PyTorch."""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpctrain import __version__
from hpctrain.checkpoint.manifest import Manifest, sha256
from hpctrain.checkpoint.naming import MANIFEST
from hpctrain.errors import CheckpointError, HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import VersionRow
from hpctrain.registry import standalone_gpt
from hpctrain.registry.versions import aliases_of, results, spec_of
from hpctrain.registry.weights import file_sha256, write_safetensors, write_torch

EXPORT_FORMAT = "hpctrain-model-export/1"
REFERENCE_PREFIX = "model."  # the reference trainer keeps the GPT's weights under model.*


def export_version(ledger: Ledger, version: VersionRow, out: Path, fmt: str) -> tuple[list[str], bool]:
    """Write ``version`` to the folder ``out`` (new, or empty), all at once: (the files' names, True); (its files,
    False) when ``out`` holds this export already (a run killed after its rename, or another one first).

    The weights are streamed tensor by tensor (see ``weights``), each chunk checked against its checksum as it is
    read, into a hidden folder beside ``out`` that is renamed to it at the end; a stop signal removes that folder,
    and a killed export's is removed by the next export to the same place."""
    name = f"{version['model']}:{version['version']}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return _exported(out, version, fmt), False
    ckpt = Path(version["checkpoint"])
    try:
        changed = sha256(ckpt / MANIFEST) != version["manifest_sha256"]
    except OSError as exc:
        raise CheckpointError(f"{ckpt}: {name}'s checkpoint cannot be read: {exc.strerror}") from None
    if changed:
        raise CheckpointError(f"{ckpt}: {name}'s checkpoint changed since it was registered (manifest sha256)")
    from hpctrain.checkpoint.reader import load_values, quick_check

    manifest = quick_check(ckpt)  # every chunk is there; each is verified as the weights are written
    spec = spec_of(ledger, version)
    reference = spec.model is not None and any(n.startswith(REFERENCE_PREFIX) for n in manifest.tensors)
    if reference:
        assert spec.model is not None
        config = spec.model.model_dump()
        names = {n.removeprefix(REFERENCE_PREFIX): n for n in manifest.tensors if n.startswith(REFERENCE_PREFIX)}
        _check_shapes(manifest, names, config)
    else:
        names = {n: n for n in manifest.tensors}
    _remove_stale(out)
    tmp = out.with_name(f".{out.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        with _stop_signals_raise():
            digests = _write(tmp, manifest, names, fmt)
            if reference:
                (tmp / standalone_gpt.CONFIG).write_text(json.dumps(config, indent=1) + "\n")
                shutil.copyfile(standalone_gpt.__file__, tmp / "modeling.py")
                extra = [standalone_gpt.CONFIG, "modeling.py"]
            else:
                (tmp / "values.json").write_text(json.dumps(load_values(ckpt), default=str) + "\n")
                extra = ["values.json"]
            digests.update({f: file_sha256(tmp / f) for f in extra})
            text = json.dumps(_manifest(ledger, version, digests, fmt), indent=1) + "\n"
            (tmp / "manifest.json").write_text(text)
            try:
                os.replace(tmp, out)  # atomic; takes the place of an empty folder, never of a full one
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                return _exported(out, version, fmt), False
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [*digests, "manifest.json"], True


def _exported(out: Path, version: VersionRow, fmt: str) -> list[str]:
    """The files of ``out`` if it holds the export of ``version`` in ``fmt`` already; refused otherwise."""
    want = {"format": EXPORT_FORMAT, "model": version["model"], "version": version["version"], "weights_format": fmt}
    try:
        found = json.loads((out / "manifest.json").read_text())
        same = {k: found.get(k) for k in want} == want
        same = same and found["checkpoint"]["manifest_sha256"] == version["manifest_sha256"]
        files = list(found["files"]) if same else []
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        files = []
    if not files or not all((out / f).is_file() for f in files):
        raise HpctrainError(f"{out}: exists and is not an empty folder")
    return [*files, "manifest.json"]


def _check_shapes(manifest: Manifest, names: dict[str, str], config: dict[str, Any]) -> None:
    """The exported definition takes exactly the exported weights (names and shapes), built without memory."""
    import torch

    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in standalone_gpt.build(**config).state_dict().items()}
    have = {out: manifest.tensor(n).meta.shape for out, n in names.items()}
    if want != have:
        wrong = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
        raise CheckpointError(
            f"the reference GPT does not take these {len(have)} weights: {', '.join(wrong[:5])} differ"
        )


def _write(folder: Path, manifest: Manifest, names: dict[str, str], fmt: str) -> dict[str, str]:
    """The weights file in ``fmt``: {its name: its sha256}."""
    name = standalone_gpt.WEIGHTS[fmt]
    if fmt == "safetensors":
        return {name: write_safetensors(folder / name, manifest, names)}
    staged = folder / ".staged.safetensors"
    write_safetensors(staged, manifest, names)
    digest = write_torch(folder / name, staged)
    staged.unlink()
    return {name: digest}


def _remove_stale(out: Path) -> None:
    """Remove the hidden folders that exports to ``out`` killed on this host left behind."""
    host = socket.gethostname()
    for tmp in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        left, _, pid = tmp.name.rpartition("-")
        if left.endswith(f".tmp-{host}") and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


@contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP end the export as an exception would (its hidden folder removed), where they can."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _manifest(ledger: Ledger, version: VersionRow, digests: dict[str, str], fmt: str) -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "model": version["model"],
        "version": version["version"],
        "aliases": aliases_of(ledger, version),
        "weights_format": fmt,
        "files": digests,
        "checkpoint": {
            "path": version["checkpoint"],
            "manifest_sha256": version["manifest_sha256"],
            "job_id": version["job_id"],
            "task_index": version["task_index"],
            "step": version["step"],
        },
        "lineage": json.loads(version["lineage_json"]),
        "evaluations": results(ledger, version),
        "registered": {"at": version["registered_at"], "by": version["registered_by"]},
        "exported_by": f"hpctrain {__version__}",
    }
