"""`hpctrain export tensorboard DIR`: a run folder per job's task whose event files, read back with tensorboard's
own EventAccumulator, hold every metric and evaluation result by step with its time; exporting again leaves one
copy of each point."""

from __future__ import annotations

import pytest

from hpctrain.ledger import Ledger

from helpers.cli import run_cli
from helpers.trackers import T0, ledger_with_runs

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
make_ndarray = pytest.importorskip("tensorboard.util.tensor_util").make_ndarray


def scalars(folder) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of the folder's event files (tensorboard's writer stores them as tensors of its scalars plugin,
    which TensorBoard's Scalars dashboard shows)."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert all(acc.SummaryMetadata(tag).plugin_data.plugin_name == "scalars" for tag in tags)
    return {tag: [(e.step, float(make_ndarray(e.tensor_proto)), e.wall_time) for e in acc.Tensors(tag)] for tag in tags}


def test_every_point_by_step_in_a_folder_per_run_and_once_after_a_second_export(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, array = ledger_with_runs(ledger, tmp_path)
    out = tmp_path / "tb"
    for _ in range(2):
        done = run_cli("export", "tensorboard", str(out))
        assert done.returncode == 0 and done.stdout == f"TensorBoard runs in {out}: 3 (241 scalars)\n", done.stderr
    folders = sorted(str(p.relative_to(out)) for p in out.rglob("events.out.tfevents.*"))
    assert [f.rsplit("/", 1)[0] for f in folders] == [f"{plain}-gpt-a", f"{array}-gpt-b/task-0", f"{array}-gpt-b/task-1"]
    a = scalars(out / f"{plain}-gpt-a")
    assert set(a) == {"loss", "lr", "step_time_s", "heldout/eval/loss"}
    assert [(s, v) for s, v, _ in a["loss"]] == [(s, pytest.approx(3.0 / s)) for s in range(1, 41)]
    assert a["loss"][0][2] == T0 + 1 and [(s, v) for s, v, _ in a["heldout/eval/loss"]] == [(40, 2.5)]
    b1 = scalars(out / f"{array}-gpt-b" / "task-1")
    assert [(s, v) for s, v, _ in b1["loss"]] == [(s, pytest.approx(5.0 / s)) for s in range(1, 21)]


def test_one_job_and_a_folder_that_cannot_be_written(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        plain, _ = ledger_with_runs(ledger, tmp_path)
    one = run_cli("export", "tensorboard", str(tmp_path / "one"), str(plain))
    assert one.returncode == 0 and "runs in" in one.stdout and len(list((tmp_path / "one").iterdir())) == 1
    (tmp_path / "file").write_text("")
    refused = run_cli("export", "tensorboard", str(tmp_path / "file" / "tb"))
    assert refused.returncode == 2 and refused.stderr.startswith(f"hpctrain: error: {tmp_path / 'file' / 'tb'}: cannot")
    assert refused.stderr.count("\n") == 1
