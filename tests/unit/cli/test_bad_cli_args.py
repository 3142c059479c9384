"""Bad CLI flags and arguments, generated: each is refused with exit 2 and one error line (hpctrain's, or click's
usage error), in process and as a user runs them, before any Slurm command runs and without a ledger row
(helpers.bad_input)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.jobs.accounting import GROUPS

from helpers.bad_input import GOOD_SPEC, assert_ledger_untouched, assert_rejected, examples, invoke
from helpers.cli import run_cli

pytestmark = pytest.mark.timeout(180)  # a hang fails with its stack instead of holding the shared machine


ARRAY_OK = re.compile(r"[0-9]+(%[0-9]*)?")
bad_array = st.one_of(
    st.sampled_from(["0", "-3", "5%x", "%", "1e3", "0%2", "x", "3%-1", "5 ", " 5", "5%%2", "2,3", "0-3", "1.5"]),
    st.text(alphabet="0123456789%-+e. x", min_size=1, max_size=6),
    st.text(min_size=1, max_size=6),
).filter(lambda a: not (ARRAY_OK.fullmatch(a) and int(a.partition("%")[0]) >= 1)
         # Other scripts' digits pass submit's isdigit() check: see test_known_cli_crashes.
         and not any(c.isdigit() and not c.isascii() for c in a))


def is_date(text: str) -> bool:
    try:
        datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return False
    return True


def converts(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


HELP = {"-h", "--help"}
no_nul = st.text(max_size=10).filter(lambda t: "\x00" not in t and t not in HELP)
missing_job = st.one_of(no_nul.filter(lambda t: not t.isdigit()), st.integers(1, 2**63 - 1).map(str))
bad_args = st.one_of(
    bad_array.map(lambda a: ("submit", "{spec}", "--site", "dev", "--array", a)),
    no_nul.filter(lambda t: not converts(float, t)).map(lambda t: ("status", "--no-refresh", "--interval", t)),
    no_nul.filter(lambda t: not converts(float, t)).map(lambda t: ("status", "--no-refresh", "--max-interval", t)),
    no_nul.filter(lambda t: not converts(int, t)).map(lambda t: ("status", "--no-refresh", "--count", t)),
    st.one_of(no_nul, st.builds("2026-{:02d}-{:02d}".format, st.integers(0, 99), st.integers(32, 99)),
              st.builds("2026-{:02d}-01".format, st.integers(13, 99))).filter(lambda t: t and not is_date(t)).map(
        lambda t: ("cost", "--no-refresh", "--since", t)),
    no_nul.filter(lambda t: t not in GROUPS).map(lambda t: ("cost", "--no-refresh", "--by", t)),
    missing_job.map(lambda j: ("show", j)),
    missing_job.map(lambda j: ("metrics", j, "--no-refresh")),
    missing_job.map(lambda j: ("cancel", j)),
    missing_job.map(lambda j: ("rerun", j)),
    no_nul.map(lambda t: ("sweep", "status", t)),
    st.text(min_size=1, max_size=10).filter(lambda t: "\x00" not in t).map(
        lambda t: ("ckpt", "verify", "{tmp}/missing/" + t)),
)


def fill(args: tuple[str, ...], spec: Path) -> list[str]:
    """Put a valid spec file and this test's directory into generated arguments."""
    return [a.replace("{spec}", str(spec)).replace("{tmp}", str(spec.parent)) for a in args]


@examples(60)
@given(args=bad_args)
def test_bad_cli_arguments_in_process(tmp_path, isolated_ledger, no_slurm, args):
    env, calls = no_slurm
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD_SPEC)
    result = invoke(*fill(args, spec), env=env)
    assert_rejected(result.exit_code, result.stderr)
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


@pytest.mark.parametrize("args", [
    ("submit", "{spec}", "--site", "dev", "--array", "0"),
    ("submit", "{spec}", "--site", "dev", "--array", "5%x"),
    ("submit", "{spec}", "--site", "dev,example-ib-cluster"),  # several clusters: --soonest picks one, a plain submit cannot
    ("where", "{spec}", "--site", "dev,nosuch"),
    ("status", "--no-refresh", "--interval", "abc"),
    ("cost", "--no-refresh", "--since", "2026-13-45"),
    ("show", "notanumber"),
    ("metrics", "999999", "--no-refresh"),
    ("sweep", "status", "nosuch"),
    ("ckpt", "verify", "/nonexistent"),
])
def test_bad_cli_arguments_as_a_user_runs_them(tmp_path, isolated_ledger, no_slurm, args):
    env, calls = no_slurm
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD_SPEC)
    out = run_cli(*fill(args, spec), env=env)
    assert_rejected(out.returncode, out.stderr)
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


def test_ckpt_verify_of_a_directory_without_checkpoints(tmp_path):
    result = invoke("ckpt", "verify", str(tmp_path))
    assert_rejected(result.exit_code, result.stderr)
    assert result.stderr == f"hpctrain: error: {tmp_path}: no checkpoints (step_<N> directories) found\n"


@pytest.mark.parametrize("args", [
    ("show", "99999999999999999999"),  # past SQLite's integers
    ("metrics", "99999999999999999999", "--no-refresh"),
    ("show", "\u00b2"),  # a digit to str.isdigit, not to int()
    ("status", "--no-refresh", "--limit", "99999999999999999999"),
    ("status", "--no-refresh", "--watch", "--count", "2", "--interval", "-1"),
    ("status", "--no-refresh", "--watch", "--count", "2", "--interval", "nan"),
    ("submit", "{spec}", "--site", "dev", "--array", "5%0"),
    ("submit", "{spec}", "--site", "dev", "--array", "\u00b2"),
    ("submit", "{spec}", "--site", "dev", "--array", "100001"),
    ("submit", "{spec}", "--site", "dev", "--array", ""),
    ("cost", "--no-refresh", "--since", ""),
])
def test_edge_cli_values_are_refused(tmp_path, no_slurm, args):
    env, calls = no_slurm
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD_SPEC)
    result = invoke(*fill(args, spec), env=env)
    assert_rejected(result.exit_code, result.stderr)
    assert calls() == {}
