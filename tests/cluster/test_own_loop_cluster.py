"""docs/own-loop-to-model.md, followed as written: its spec submitted, its commands run one after the other on the
dev cluster (the ledger id in them replaced by the job's), from a loop of your own to an exported model version."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers.cli import HPCTRAIN
from helpers.cluster import finish
from helpers.paths import REPO

from hpctrain.ledger import Ledger

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason=(
                  "host's Slurm only: the page's commands, not a Slurm release's behaviour (the lanes run the "
                  "evaluation and registry tests)"))]

PAGE = REPO / "docs" / "own-loop-to-model.md"
DOCS_JOB = "12"  # the ledger id the page's commands show


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(), re.M | re.S)


def local(spec: str) -> str:
    """The page's spec as this test runs it: this Python, the repository's scripts, memory for the dev cluster's
    nodes (which share this machine's)."""
    spec = spec.replace('"python"', json.dumps(sys.executable)).replace('"scripts/', f'"{REPO}/scripts/')
    return spec.replace("[resources]\n", '[resources]\nmem = "1G"\n')


def test_the_pages_commands_take_a_loop_of_your_own_to_an_exported_model(dev_cluster, isolated_ledger, tmp_path):
    (tmp_path / "own-loop.toml").write_text(local(blocks("toml")[0]))
    job = None
    for line in blocks("bash")[0].splitlines():
        argv = shlex.split(line.split("  #")[0])
        assert argv[0] == "hpctrain", line
        argv = [str(job) if a == DOCS_JOB and job else a for a in argv[1:]]
        done = subprocess.run([*HPCTRAIN, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        if argv[0] == "submit":
            job = int(re.search(r"ledger id (\d+)", done.stdout)[1])
            assert f"finished: {job} COMPLETED" in done.stdout
        elif argv[0] == "ckpt":
            assert sorted(int(s) for s in re.findall(r"step_0*(\d+)", done.stdout)) == [20, 40, 60], done.stdout
        elif argv[0] == "eval":
            asked = [int(m) for m in re.findall(r"submitted, ledger id (\d+)", done.stdout)]
            assert len(asked) == 3, done.stdout
            with Ledger(isolated_ledger) as ledger:
                assert [finish(ledger, j, timeout=300) for j in asked] == ["COMPLETED"] * 3
        elif argv[0] == "show":
            assert done.stdout.count("mse") >= 3, done.stdout
    with Ledger(isolated_ledger) as ledger:
        rows = ledger.evaluations.of_job(job)
        versions = ledger.registry.versions("regressor")
    assert sorted((r["step"], r["state"]) for r in rows) == [(20, "done"), (40, "done"), (60, "done")]
    assert [(v["version"], v["step"]) for v in versions] == [(1, 60)]
    exported = tmp_path / "regressor-v1"
    manifest = json.loads((exported / "manifest.json").read_text())
    assert (exported / "model.safetensors").is_file()
    assert json.dumps(manifest).count('"mse"') >= 1, manifest

