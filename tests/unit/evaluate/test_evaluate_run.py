"""An evaluation job's own part: the user's evaluator under its contract (environment in, a JSON object of metrics
out), and every way it can fail as one line with no result."""

from __future__ import annotations

import json
import sys

import pytest

from hpctrain.contract import EVAL_CHECKPOINT_ENV, EVAL_LAYOUT_ENV, EVAL_OUTPUT_ENV, EVAL_STEP_ENV
from hpctrain.evaluate.run import EvaluationError, Target, parse_metrics, run_command

TARGET = Target(7, -1, 40, __import__("pathlib").Path("/ck/step_00000040"))


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_evaluator_finds_the_checkpoint_in_its_environment_and_writes_metrics():
    code = (f"import json, os; e = os.environ; json.dump({{'seen_step': int(e['{EVAL_STEP_ENV}']), "
            f"'tp': json.loads(e['{EVAL_LAYOUT_ENV}'])['tp'], 'path_len': len(e['{EVAL_CHECKPOINT_ENV}'])}}, "
            f"open(e['{EVAL_OUTPUT_ENV}'], 'w'))")
    got = run_command("mine", python(code), TARGET, {"dp": 1, "tp": 2, "pp": 2})
    assert got == {"seen_step": 40.0, "tp": 2.0, "path_len": float(len(str(TARGET.checkpoint)))}


@pytest.mark.parametrize("code, error", [
    ("raise SystemExit(3)", "evaluator mine: .* exited 3"),
    ("pass", r"evaluator mine: wrote no metrics \(expected a JSON object in \$HPCTRAIN_EVAL_OUTPUT\)"),
    (f"import os; open(os.environ['{EVAL_OUTPUT_ENV}'], 'w').write('{{nope')", "evaluator mine: its metrics are not JSON"),
])
def test_a_crash_no_output_or_bad_json_is_one_line(code, error):
    with pytest.raises(EvaluationError, match=error):
        run_command("mine", python(code), TARGET, {})


def test_a_missing_program_is_one_line():
    with pytest.raises(EvaluationError, match=r"evaluator mine: cannot run '/no/such/evaluator': No such file"):
        run_command("mine", ["/no/such/evaluator"], TARGET, {})


@pytest.mark.parametrize("text, error", [
    ("[1, 2]", "must be a JSON object of numbers by name"),
    ("{}", "must be a JSON object of numbers by name"),
    ('{"acc": "high"}', "'acc' is 'high', not a finite number"),
    ('{"acc": true}', "'acc' is True, not a finite number"),
    ('{"ppl": NaN}', "'ppl' is nan, not a finite number"),
])
def test_metrics_must_be_an_object_of_finite_numbers(text, error):
    with pytest.raises(EvaluationError, match=error):
        parse_metrics("mine", text)
    assert parse_metrics("mine", json.dumps({"ppl": 12, "acc": 0.5})) == {"ppl": 12.0, "acc": 0.5}
