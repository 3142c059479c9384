"""Model versions: registering a job's checkpoint pins it (retention keeps it), keeps the job's lineage and the
manifest's digest, numbers versions per model, never changes one; references and names are checked."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from hpctrain.checkpoint import Checkpointer, Retention
from hpctrain.checkpoint.pins import pins
from hpctrain.ledger import Ledger
from hpctrain.registry.gate import Gate
from hpctrain.registry.names import Ref, RegistryError, parse_ref
from hpctrain.registry.versions import register, resolve

from helpers.cli import run_cli
from helpers.registry import job_with_checkpoints


def test_a_version_keeps_the_checkpoint_its_lineage_and_its_number(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run-a", (2, 4))
        first = register(ledger, "gpt", job)  # the newest checkpoint
        second = register(ledger, "gpt", job, step=2)
        other = register(ledger, "other", job, step=2, gate=Gate("mine", "acc", "max", 0.5))
        assert (first["version"], first["step"], second["version"], second["step"]) == (1, 4, 2, 2)
        assert other["version"] == 1 and ledger.registry.model("other")["gate_mode"] == "max"
        lineage = json.loads(first["lineage_json"])
        assert lineage["code"] == {"commit": "abc123", "dirty": False} and lineage["seed"] == 7
        assert lineage["data"]["sha256"] == "d" * 64 and lineage["checkpoint"]["step"] == 4
        assert len(first["manifest_sha256"]) == 64
        assert resolve(ledger, parse_ref("gpt")) == second and resolve(ledger, parse_ref("gpt:1")) == first
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            ledger.db.execute("UPDATE model_versions SET step = 9 WHERE model = 'gpt'")
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            ledger.db.execute("DELETE FROM model_versions")
    assert pins(tmp_path / "run-a" / "step_00000002") == ["gpt", "other"]


def test_retention_never_deletes_a_pinned_checkpoint(isolated_ledger, tmp_path):
    """Registered at step 1, the checkpoint outlives keep_last = 1 over three more saves; the others go."""
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run", (1,))
        register(ledger, "gpt", job, step=1)
    with Checkpointer(tmp_path / "run", retention=Retention(keep_last=1), journal=None) as ck:
        for step in (2, 3, 4):
            ck.save(step, {"w": np.zeros(2, dtype=np.float32)})
    assert sorted(p.name for p in (tmp_path / "run").glob("step_*")) == ["step_00000001", "step_00000004"]
    listed = run_cli("ckpt", "ls", str(tmp_path / "run"))
    assert listed.returncode == 0 and "pinned by" in listed.stdout and "gpt" in listed.stdout


@pytest.mark.parametrize("args, message", [
    (["register", "gpt", "99"], "job 99: no such ledger id"),
    (["register", "bad/name", "1"], "model name 'bad/name': use 1-100 letters"),
    (["register", "--", "-rf", "1"], "model name '-rf'"),
    (["register", "gpt", "1", "--step", "3"], "job 1: no committed checkpoint at step 3 (committed: 2, 4)"),
    (["show", "nope"], "model 'nope': not registered"),
    (["show", "gpt:7"], "gpt:7: model gpt has versions 1 to 1"),
    (["show", "gpt@prod"], "gpt@prod: model gpt has no alias 'prod'"),
    (["show", "gpt:0"], "a version is a number from 1"),
    (["show", "gpt@Prod!"], "alias 'Prod!'"),
    (["register", "gpt", "1", "--gate-metric", "eval/bpb"], "model gpt: has its gate already"),
    (["register", "new", "1", "--gate-mode", "median"], "'median' is not one of"),
])
def test_bad_references_and_names_are_one_line_and_change_nothing(isolated_ledger, tmp_path, args, message):
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run-a", (2, 4))
        register(ledger, "gpt", job)
    out = run_cli("model", *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 or out.stderr.startswith("Usage:")  # ours: one line; click's usage errors
    with Ledger(isolated_ledger) as ledger:
        assert [m["name"] for m in ledger.registry.models()] == ["gpt"]
        assert len(ledger.registry.versions("gpt")) == 1


def test_a_checkpoint_registers_once_per_model_and_a_gone_one_not_at_all(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run-a", (2, 4))
        first = register(ledger, "gpt", job)
        assert register(ledger, "gpt", job) == first  # the version it is already
        for p in (tmp_path / "run-a" / "step_00000002").iterdir():
            p.unlink() if p.is_file() else None
        with pytest.raises(Exception, match="cannot register it"):
            register(ledger, "gpt", job, step=2)
        assert len(ledger.registry.versions("gpt")) == 1
    assert pins(tmp_path / "run-a" / "step_00000002") == []  # the failed registration's pin is gone
    again = run_cli("model", "register", "gpt", str(job))
    assert again.returncode == 0 and again.stdout.startswith("gpt:1 is already job 1 step 4, ")


def test_references_parse():
    assert parse_ref("gpt") == Ref("gpt") and parse_ref("gpt@latest") == Ref("gpt")
    assert parse_ref("g.p-t_2:12") == Ref("g.p-t_2", version=12) and parse_ref("gpt@prod") == Ref("gpt", alias="prod")
    for bad in ("", "gpt:", "gpt:x", "gpt@", "a@b@c", "gpt:1:2", "x" * 101, ".hidden"):
        with pytest.raises(RegistryError):
            parse_ref(bad)
