"""`hpctrain export tensorboard DIR`: a run folder per job's task that has values, whose event files, read back with
tensorboard's own EventAccumulator, hold every metric and evaluation result by step with its time as scalars;
exporting again, after a kill at any step or twice at once, leaves one copy of each point; no symbolic link below
DIR is followed."""

from __future__ import annotations

import os
import subprocess

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.ledger import Ledger

from helpers.cli import HPCTRAIN, run_cli
from helpers.trackers import T0, ledger_points, ledger_with_runs, metrics

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
record_writer = pytest.importorskip("tensorboard.summary.writer.record_writer")


def scalars(folder) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of the folder's event files, as TensorBoard's Scalars dashboard reads them."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def event_files(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if "tfevents" in p.name)


def assert_one_copy_of_the_ledger(out, ledger_path) -> None:
    """Each run folder holds one event file, and it holds each of the ledger's values of its run once."""
    folders = [f.rsplit("/", 1)[0] for f in event_files(out)]
    assert len(folders) == len(set(folders)) == 3, event_files(out)
    for (job, task), expected in ledger_points(ledger_path).items():
        [folder] = [f for f in folders if f.split("-")[0] == job and (task == "-1" or f.endswith(f"task-{task}"))]
        held = [(tag, step, pytest.approx(value, rel=1e-6), pytest.approx(at, abs=1e-3))
                for tag, points in scalars(out / folder).items() for step, value, at in points]
        assert sorted(held, key=str) == sorted(
            ((n, s, v, at / 1000) for (n, s, v, at), count in expected.items() for _ in range(count)), key=str)


def test_every_point_by_step_in_a_folder_per_run_and_once_after_a_second_export(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, array = ledger_with_runs(ledger, tmp_path)
        ledger.jobs.record({"name": "no-metrics", "site": "dev"})  # an evaluation job's like: nothing to show
    out = tmp_path / "tb"
    for _ in range(2):
        done = run_cli("export", "tensorboard", str(out))
        assert done.returncode == 0 and done.stdout == f"TensorBoard runs in {out}: 3 (241 scalars)\n", done.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"{plain}-gpt-a", f"{array}-gpt-b"]
    assert [f.rsplit("/", 1)[0] for f in event_files(out)] == [f"{plain}-gpt-a", f"{array}-gpt-b/task-0",
                                                               f"{array}-gpt-b/task-1"]
    a = scalars(out / f"{plain}-gpt-a")
    assert set(a) == {"loss", "lr", "step_time_s", "heldout/eval/loss"}
    assert [(s, v) for s, v, _ in a["loss"]] == [(s, pytest.approx(3.0 / s)) for s in range(1, 41)]
    assert a["loss"][0][2] == T0 + 1 and [(s, v) for s, v, _ in a["heldout/eval/loss"]] == [(40, 2.5)]
    b1 = scalars(out / f"{array}-gpt-b" / "task-1")
    assert [(s, v) for s, v, _ in b1["loss"]] == [(s, pytest.approx(5.0 / s)) for s in range(1, 21)]
    assert_one_copy_of_the_ledger(out, isolated_ledger)


def test_one_job_and_a_folder_that_cannot_be_written(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path)
    one = run_cli("export", "tensorboard", str(tmp_path / "one"), str(plain))
    assert one.returncode == 0 and "runs in" in one.stdout and len(list((tmp_path / "one").iterdir())) == 1
    (tmp_path / "file").write_text("")
    refused = run_cli("export", "tensorboard", str(tmp_path / "file" / "tb"))
    assert refused.returncode == 2 and refused.stderr.startswith(f"hpctrain: error: {tmp_path / 'file' / 'tb'}: cannot")
    assert refused.stderr.count("\n") == 1


def test_a_linked_run_folder_is_not_followed(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path)
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "tb"
    elsewhere.mkdir()
    out.mkdir()
    (elsewhere / "events.out.tfevents.1.theirs").write_bytes(b"theirs")
    (out / f"{plain}-gpt-a").symlink_to(elsewhere)
    refused = run_cli("export", "tensorboard", str(out), str(plain))
    assert refused.returncode == 2 and refused.stderr == (
        f"hpctrain: error: {out / f'{plain}-gpt-a'}: cannot write there: a symbolic link: not followed (hpctrain "
        "writes only into folders it made or found as folders)\n")
    assert [p.name for p in elsewhere.iterdir()] == ["events.out.tfevents.1.theirs"]


class Killed(BaseException):
    """What the test raises in place of SIGKILL: nothing of hpctrain's catches it."""


def test_killed_at_every_step_then_again_or_twice_at_once_one_copy(isolated_ledger, tmp_path):
    """A second export (the folders hold the first's files) killed at its 1st, 2nd, ... file operation and in the
    middle of an event file, each try going on from where the one before left; then two at once."""
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path)
    out = tmp_path / "tb"
    assert run_cli("export", "tensorboard", str(out)).returncode == 0
    with Ledger(isolated_ledger) as ledger:
        metrics(ledger, plain, -1, range(41, 45))
    ops: list[str] = []
    kill = {"op": 0, "record": 0}  # kill right after this many file operations, or event records, of a try

    def counted(kind, call):
        def step(*args, **kwargs):
            result = call(*args, **kwargs)
            ops.append(kind)
            if ops.count(kind) == kill[kind]:
                raise Killed(kind)
            return result
        return step

    with pytest.MonkeyPatch.context() as faults:  # its own: undoing it leaves the test's ledger setting in place
        for name in ("mkdir", "unlink", "rename", "fsync"):
            faults.setattr(os, name, counted("op", getattr(os, name)))
        faults.setattr(record_writer.RecordWriter, "write", counted("record", record_writer.RecordWriter.write))
        for kill["op"], kill["record"] in [(0, 40), *((n, 0) for n in range(1, 40))]:
            ops.clear()
            try:
                done = CliRunner().invoke(cli, ["export", "tensorboard", str(out)])
            except Killed:
                continue
            assert done.exit_code == 0 and kill["op"] > 9, (kill, done.output)
            break
    assert run_cli("export", "tensorboard", str(out)).returncode == 0
    assert_one_copy_of_the_ledger(out, isolated_ledger)
    both = [subprocess.Popen([*HPCTRAIN, "export", "tensorboard", str(out)], stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    assert [p.communicate(timeout=120)[1] for p in both] == ["", ""] and [p.returncode for p in both] == [0, 0]
    assert_one_copy_of_the_ledger(out, isolated_ledger)
