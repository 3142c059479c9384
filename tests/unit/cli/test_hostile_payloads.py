"""Issue 57's payload families (line breaks and separators, rich markup, mathtext, control characters and terminal
escapes, non-UTF-8 and surrogates, huge values) drawn into the post-training layer's commands and spec fields:
each is refused in one line or taken, never a traceback; what is taken is shown literally, no terminal escape ever
written raw; a cron line stays one line."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.cli.output import visible
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.registry.versions import register

from helpers.bad_input import (BASE_SPEC, assert_user_error, examples, hostile_text, invoke, toml_value,
                               write_config)
from helpers.registry import evaluated, job_with_checkpoints

RAW = ("\x1b", "\x07", "\x9b")


def taken_or_refused(result) -> str:
    """The output of a command that either ran or was refused in hpctrain's lines; never a raw escape."""
    if result.exit_code != 0:
        assert "Traceback" not in result.stderr
        if not result.stderr.startswith("Usage: "):
            assert_user_error(result.exit_code, result.stderr)
    out = result.stdout + result.stderr
    assert not any(c in out for c in RAW), repr(out[:300])
    return result.stdout


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory):
    """Two finished jobs with metrics, one with a registered, evaluated version of model gpt."""
    tmp = tmp_path_factory.mktemp("hostile")
    with Ledger(tmp / "ledger.db") as ledger:
        job = job_with_checkpoints(ledger, tmp, "run", (10,))
        other = Table(ledger, "jobs").insert({"name": "plain", "site": "dev", "state": "COMPLETED",
                                              "ended_at": time.time() - 60, "lineage_json": json.dumps({"seed": 2})})
        for j in (job, other):
            ledger.metrics.record(j, -1, 10, {"loss": 1.0, "eval/loss": math.nan}, 0, time.time())
        evaluated(ledger, job, 10, 1.0)
        register(ledger, "gpt", job)
    return tmp / "ledger.db"


@examples(40)
@given(text=hostile_text)
def test_a_reason_is_kept_and_shown_literally(ledger_path, text):
    env = {"HPCTRAIN_LEDGER": str(ledger_path), "COLUMNS": "400"}
    taken_or_refused(invoke("model", "rollback", "gpt", "--alias", "prod", env=env))
    promoted = invoke("model", "promote", "gpt", "1", "--alias", "prod", "--force", "--why", text, env=env)
    taken_or_refused(promoted)
    history = taken_or_refused(invoke("model", "history", "gpt", env=env))
    shown = visible(text)
    moved = promoted.exit_code == 0 and "->" in promoted.stdout  # not "already": each example alternates the alias
    if moved and shown.isprintable() and len(shown) < 100:  # a tab, a line break or a long one: laid out in the cell
        assert shown in history


@examples(40)
@given(text=hostile_text, option=st.sampled_from(["--metric", "--sweep"]), as_json=st.booleans())
def test_compare_takes_any_name_or_refuses_it(ledger_path, text, option, as_json):
    args = ["compare", "1", "2", option, text] if option == "--metric" else ["compare", option, text]
    out = taken_or_refused(invoke(*args, *(["--json"] if as_json else []), env={"HPCTRAIN_LEDGER": str(ledger_path)}))
    if as_json and out:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


@examples(40)
@given(text=hostile_text, option=st.sampled_from(["--log", "--site"]))
def test_a_cron_line_is_one_line_or_refused(tmp_path, text, option):
    result = invoke("sweep", "cron", option, text)
    out = taken_or_refused(result)
    if result.exit_code == 0:
        assert out.count("\n") == 1 and not any(c in out[:-1] for c in "\r\v\f\x1c\x1d\x1e\x85\u2028\u2029\n")


@examples(30)
@given(text=hostile_text)
def test_an_archive_target_is_taken_or_refused(tmp_path, text):
    here = Path(tempfile.mkdtemp(dir=tmp_path))
    with contextlib.chdir(here):  # a relative target is made here, not in the repository
        taken_or_refused(invoke("ledger", "archive", "--to", text, env={"HPCTRAIN_LEDGER": str(here / "l.db")}))


NUMBERS = st.one_of(st.floats(), st.integers(2**62, 2**80), st.integers(max_value=-1),
                    st.sampled_from(["nan", "inf", "-inf", "1e308", "0x10", "１"]))


@examples(40)
@given(value=NUMBERS, command=st.sampled_from([("eval", "1", "--follow", "--interval"), ("show",), ("metrics",),
                                               ("model", "show", "gpt:"), ("ledger", "archive", "--older-than")]))
def test_numbers_and_ids_are_bounded(ledger_path, value, command):
    value = str(value)
    args = [*command[:-1], command[-1] + value] if command[-1].endswith(":") else [*command, value]
    taken_or_refused(invoke(*args, env={"HPCTRAIN_LEDGER": str(ledger_path)}))


FIELDS = [("eval", "evaluators", "mine"), ("eval", "gate", "metric"), ("eval", "time"), ("hang", "output_s"),
          ("checkpoint", "every_minutes")]


@examples(60)
@given(field=st.sampled_from(FIELDS), text=hostile_text, as_list=st.booleans())
def test_the_new_spec_fields_take_any_value_or_refuse_it_in_lines(tmp_path, field, text, as_list):
    spec = json.loads(json.dumps(BASE_SPEC))
    node = spec
    for part in field[:-1]:
        node = node.setdefault(part, {})
    node[field[-1]] = ["python", text] if as_list or field[1] == "evaluators" else text
    here = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        toml_value(node[field[-1]]).encode()
    except UnicodeEncodeError:
        path = here / "config.json"  # a surrogate cannot be written in a TOML file: the JSON spec escapes it
        path.write_text(json.dumps(spec))
    else:
        path = write_config(here, spec, "toml")
    result = invoke("submit", "--dry-run", str(path), env={"HPCTRAIN_LEDGER": str(here / "l.db")})
    if result.exit_code != 0:
        assert_user_error(result.exit_code, result.stderr)
        assert not any(c in result.stderr for c in RAW), result.stderr[:300]
