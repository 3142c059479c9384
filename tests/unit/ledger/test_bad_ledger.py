"""Corrupt ledgers, generated and made by hand: a clear line naming the file, which keeps its bytes
(helpers.bad_input)."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.errors import LedgerError
from hpctrain.ledger import SCHEMA_VERSION, Ledger
from hpctrain.ledger.table import Table

from helpers.bad_input import assert_rejected, examples, invoke
from helpers.cli import run_cli

pytestmark = pytest.mark.timeout(180)  # a hang fails with its stack instead of holding the shared machine


def real_ledger(path: Path, jobs: int = 40) -> bytes:
    with Ledger(path) as ledger:
        for i in range(jobs):
            Table(ledger, "jobs").insert({"name": f"job{i}", "site": "dev", "state": "PENDING",
                                          "updated_at": time.time(), "spec_json": {"pad": "x" * 400}})
    return path.read_bytes()


def fresh_file(directory: Path) -> Path:
    """A new file name for each example: a connection a failed example left open must not meet the next one."""
    return Path(tempfile.mkdtemp(dir=directory)) / "ledger.db"


@examples(60)
@given(garbage=st.binary(min_size=2, max_size=8192))  # 1 byte: see test_one_byte_ledger_is_kept
def test_garbage_ledger_is_refused_and_kept(tmp_path, garbage):
    path = fresh_file(tmp_path)
    path.write_bytes(garbage)
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    assert str(info.value).startswith(f"{path}: cannot open ledger: ")
    assert "\n" not in str(info.value)
    assert path.read_bytes() == garbage


def test_one_byte_ledger_is_kept(tmp_path):
    path = tmp_path / "one-byte.db"
    path.write_bytes(b"x")
    with pytest.raises(LedgerError):
        Ledger(path)
    assert path.read_bytes() == b"x"


@examples(40)
@given(cut=st.floats(0.0, 1.0))
def test_truncated_ledger_is_refused_and_kept(tmp_path, cut):
    source = tmp_path / "source.db"
    if not source.exists():
        real_ledger(source)
    data = source.read_bytes()
    page = 4096
    kept = 2 + int(cut * (len(data) - page - 3))  # 2 bytes or more (1: see above), less than all pages
    path = fresh_file(tmp_path)
    path.write_bytes(data[:kept])
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    assert str(info.value).startswith(f"{path}: cannot open ledger: ")
    assert path.read_bytes() == data[:kept]


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(3000))


def _halved(path: Path) -> None:
    data = real_ledger(path, jobs=1)
    path.write_bytes(data[: len(data) // 2])


def _newer_schema(path: Path) -> None:
    real_ledger(path, jobs=1)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


@pytest.mark.parametrize("damage, says", [
    (_garbage, "cannot open ledger: file is not a database"),
    (_halved, "cannot open ledger: database disk image is malformed"),
    (_newer_schema, f"ledger schema v{SCHEMA_VERSION + 1} is newer than this hpctrain (v{SCHEMA_VERSION}): upgrade hpctrain"),
])
def test_cli_on_a_damaged_ledger(tmp_path, damage, says):
    # Not the isolated ledger: the fixture reads that one when the test ends.
    path = tmp_path / "damaged.db"
    damage(path)
    before = path.read_bytes()
    out = run_cli("status", "--site", "dev", "--no-refresh", env={"HPCTRAIN_LEDGER": str(path)})
    assert_rejected(out.returncode, out.stderr)
    assert out.stderr == f"hpctrain: error: {path}: {says}\n"
    assert path.read_bytes() == before


def _bad_utf8_in_a_row(path: Path) -> None:
    data = real_ledger(path, jobs=3)
    assert data.count(b"job1") == 1
    path.write_bytes(data.replace(b"job1", b"jo\xff\xfe"))


def _broken_table_page(path: Path) -> None:
    real_ledger(path)
    with sqlite3.connect(path) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()
        (page,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page] = 0x00  # not a b-tree page type
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_bad_utf8_in_a_row, _broken_table_page])
def test_cli_on_a_ledger_damaged_inside(tmp_path, damage):
    path = tmp_path / "damaged.db"
    damage(path)
    before = path.read_bytes()
    result = invoke("status", "--site", "dev", "--no-refresh", "--all", env={"HPCTRAIN_LEDGER": str(path)})
    assert path.read_bytes() == before
    assert_rejected(result.exit_code, result.stderr)
