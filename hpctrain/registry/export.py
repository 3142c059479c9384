"""Hand a version on: its checkpoint (checksums verified, unchanged since registration) written to a new folder
as one weights file (safetensors or torch), a manifest (the version, its lineage and evaluation results, each
file's sha256) and, for the reference GPT, ``config.json`` and ``modeling.py`` that load it in plain PyTorch."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from hpctrain import __version__
from hpctrain.checkpoint.manifest import sha256
from hpctrain.checkpoint.naming import MANIFEST
from hpctrain.errors import CheckpointError, HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import VersionRow
from hpctrain.registry import standalone_gpt
from hpctrain.registry.versions import aliases_of, results, spec_of

EXPORT_FORMAT = "hpctrain-model-export/1"
REFERENCE_PREFIX = "model."  # the reference trainer keeps the GPT's weights under model.*


def export_version(ledger: Ledger, version: VersionRow, out: Path, fmt: str) -> list[str]:
    """Write ``version`` to the folder ``out`` (new, or empty), all at once; returns the files' names."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HpctrainError(f"{out}: exists and is not an empty folder")
    ckpt = Path(version["checkpoint"])
    name = f"{version['model']}:{version['version']}"
    try:
        changed = sha256(ckpt / MANIFEST) != version["manifest_sha256"]
    except OSError as exc:
        raise CheckpointError(f"{ckpt}: {name}'s checkpoint cannot be read: {exc.strerror}") from None
    if changed:
        raise CheckpointError(f"{ckpt}: {name}'s checkpoint changed since it was registered (manifest sha256)")
    from hpctrain.checkpoint.reader import load_flat, load_values, verify

    manifest = verify(ckpt)
    spec = spec_of(ledger, version)
    reference = spec.model is not None and any(n.startswith(REFERENCE_PREFIX) for n in manifest.tensors)
    if reference:
        names = [n for n in manifest.tensors if n.startswith(REFERENCE_PREFIX)]
        weights = {n.removeprefix(REFERENCE_PREFIX): t for n, t in load_flat(ckpt, names).items()}
    else:
        weights = load_flat(ckpt)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = _write(tmp, weights, fmt)
        if reference:
            assert spec.model is not None
            (tmp / standalone_gpt.CONFIG).write_text(json.dumps(spec.model.model_dump(), indent=1) + "\n")
            shutil.copyfile(standalone_gpt.__file__, tmp / "modeling.py")
            _check_loads(tmp, weights)
            files += [standalone_gpt.CONFIG, "modeling.py"]
        else:
            (tmp / "values.json").write_text(json.dumps(load_values(ckpt), default=str) + "\n")
            files.append("values.json")
        (tmp / "manifest.json").write_text(json.dumps(_manifest(ledger, version, tmp, files, fmt), indent=1) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [*files, "manifest.json"]


def _write(folder: Path, weights: dict[str, Any], fmt: str) -> list[str]:
    name = standalone_gpt.WEIGHTS[fmt]
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: t.contiguous() for k, t in weights.items()}, folder / name)
    else:
        import torch

        torch.save(weights, folder / name)
    return [name]


def _check_loads(folder: Path, weights: dict[str, Any]) -> None:
    """The exported definition takes exactly the exported weights (names and shapes)."""
    try:
        standalone_gpt.load(folder)
    except RuntimeError as exc:
        raise CheckpointError(f"the reference GPT does not take these {len(weights)} weights: {exc}") from None


def _manifest(ledger: Ledger, version: VersionRow, folder: Path, files: list[str], fmt: str) -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "model": version["model"],
        "version": version["version"],
        "aliases": aliases_of(ledger, version),
        "weights_format": fmt,
        "files": {f: sha256(folder / f) for f in files},
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
