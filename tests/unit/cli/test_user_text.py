"""User text from the ledger (job, hyperparameter, metric and evaluator names, a promotion's reason, a sweep's metric,
an account) in every read command's output: shown literally, never read as rich markup or emoji codes, its terminal
escapes (CSI, OSC, C1) shown as ``\\x1b`` and never written raw; and --json output is strict JSON."""

from __future__ import annotations

import json
import math
import time

import pytest

from hpctrain.cli.output import visible
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.registry.aliases import decide, promote
from hpctrain.registry.gate import Gate
from hpctrain.registry.versions import register
from hpctrain.sweep import store
from hpctrain.sweep.spec import load_sweep_spec

from helpers.bad_input import invoke, toml_key
from helpers.registry import evaluated, job_with_checkpoints

# Markup that raises (a closing tag with none open), markup that would restyle or link, an emoji code, a window
# title (OSC), a screen clear (CSI) and a C1 control.
PAYLOAD = "p[/][bold]:smile:[link=u]\x1b]0;t\x07\x1b[2J\x9bm"
SHOWN = visible(PAYLOAD)
RAW = ("\x1b", "\x07", "\x9b")


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory):
    """A job whose name, account, hyperparameter, metric, evaluator and event carry PAYLOAD; a model version promoted
    with PAYLOAD as its reason and gate; a sweep whose metric is PAYLOAD."""
    tmp = tmp_path_factory.mktemp("user-text")
    lineage = {"hyperparameters": {PAYLOAD: PAYLOAD}, "seed": 1, "code": {"commit": PAYLOAD}}
    with Ledger(tmp / "ledger.db") as ledger:
        job = Table(ledger, "jobs").insert({"name": PAYLOAD, "site": "dev", "user": "alice", "account": PAYLOAD,
                                            "state": "RUNNING", "submitted_at": time.time() - 60,
                                            "lineage_json": json.dumps(lineage)})
        other = Table(ledger, "jobs").insert({"name": "plain", "site": "dev", "user": "alice", "account": "teama",
                                              "state": "COMPLETED", "lineage_json": json.dumps({"seed": 2})})
        for j in (job, other):
            ledger.attempts.record(j, -1, 1, state="COMPLETED", cause="completed", started_at=time.time() - 3600,
                                   ended_at=time.time(), alloc_gpus=1, elapsed_s=3600)
            for step in (1, 2):
                ledger.metrics.record(j, -1, step, {PAYLOAD: 1.0 / step, "loss": math.inf}, 0, time.time())
        ledger.evaluations.done(job, -1, 2, PAYLOAD, {PAYLOAD: 0.5}, time.time())
        ledger.events.add(job, "note", PAYLOAD)
        version = job_with_checkpoints(ledger, tmp, "run", (10,))
        evaluated(ledger, version, 10, 1.0)
        evaluated(ledger, version, 10, 2.0, evaluator=PAYLOAD)
        register(ledger, "gpt", version, gate=Gate(PAYLOAD, PAYLOAD, "min"))
        promote(ledger, decide(ledger, "gpt", 1, "prod"), PAYLOAD, True)
        spec = tmp / "sweep.toml"
        spec.write_text(f'name = "s1"\nmethod = "random"\nmetric = {toml_key(PAYLOAD)}\ndirection = "minimize"\nmax_trials = 1\n'
                        '[search]\nlr = { type = "uniform", low = 0.1, high = 0.2 }\n'
                        '[job]\nname = "trial"\ncommand = ["true"]\n')
        store.register(ledger, load_sweep_spec(spec), spec)
    return tmp / "ledger.db"


READS = [
    ("status", "--no-refresh", "--all"),
    ("show", "1"),
    ("show", "1", "--lineage"),
    ("metrics", "1", "--no-refresh"),
    ("compare", "1", "2", "--metric", PAYLOAD),
    ("model", "ls"),
    ("model", "show", "gpt"),
    ("model", "history", "gpt"),
    ("sweep", "status", "s1"),
    ("cost", "--no-refresh", "--causes"),
]


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a[:2]).replace(PAYLOAD, "PAYLOAD"))
def test_ledger_text_is_shown_literally_and_its_escapes_never_raw(ledger_path, args):
    result = invoke(*args, env={"HPCTRAIN_LEDGER": str(ledger_path), "COLUMNS": "400"})  # wide: no cell is cut
    assert result.exit_code == 0, result.output
    assert SHOWN in result.stdout, result.stdout
    assert not any(c in result.output for c in RAW), result.output


@pytest.mark.parametrize("args", [
    ("status", "--no-refresh", "--all", "--json"),
    ("show", "1", "--json"),
    ("metrics", "1", "--no-refresh", "--json"),
    ("compare", "1", "2", "--metric", "loss", "--metric", PAYLOAD, "--json"),
    ("model", "history", "gpt", "--json"),
    ("cost", "--no-refresh", "--json"),
], ids=lambda a: " ".join(a[:2]))
def test_json_output_is_strict_and_keeps_the_text(ledger_path, args):
    result = invoke(*args, env={"HPCTRAIN_LEDGER": str(ledger_path)})
    assert result.exit_code == 0, result.output

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} is not JSON")

    for line in result.stdout.splitlines():
        json.loads(line, parse_constant=refuse)
    assert json.dumps(PAYLOAD)[1:-1] in result.stdout or "loss" in args

