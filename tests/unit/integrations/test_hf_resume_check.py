"""The HF callback looks at the Trainer's collator when training begins: a resume that will not be bitwise is said
once, on stderr and as a journal event that `show` lists and `status` flags."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    TrainerState,
    default_data_collator,
)

from hpctrain.config.site import Alerts
from hpctrain.contract import JOURNAL_ENV
from hpctrain.integrations.hf import BatchSeeded, HpctrainCallback
from hpctrain.jobs.alerts import job_alerts
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table


def tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"[PAD]": 0, "[MASK]": 1, "a": 2}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="a")), pad_token="[PAD]", mask_token="[MASK]"
    )


def begin(collator, journal_dir, monkeypatch, main: bool = True) -> None:
    """The callback's hook as the Trainer calls it: the prepared train DataLoader among its arguments."""
    monkeypatch.setenv(JOURNAL_ENV, str(journal_dir))
    loader = DataLoader([{"input_ids": torch.tensor([2, 2])}], batch_size=1, collate_fn=collator)
    callback = HpctrainCallback(guard=object())  # type: ignore[arg-type]
    callback.on_train_begin(None, TrainerState(is_world_process_zero=main), None, train_dataloader=loader, model=None)


def events(journal_dir) -> list[str]:
    return [r["message"] for _, r in Journal(journal_dir).records(["resume_not_bitwise"])]


@pytest.mark.parametrize(
    "collator, why",
    [
        (DataCollatorForLanguageModeling(tokenizer()), "not wrapped in BatchSeeded"),
        (lambda features: features, "not wrapped in BatchSeeded"),  # a user's own: it may draw
        (BatchSeeded(DataCollatorForLanguageModeling(tokenizer(), seed=7)), "has a seed of its own"),
    ],
)
def test_a_collator_that_makes_the_resume_inexact_is_said_once_at_start(collator, why, tmp_path, monkeypatch, capsys):
    begin(collator, tmp_path, monkeypatch)
    begin(collator, tmp_path / "other", monkeypatch, main=False)  # another rank: says nothing
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("hpctrain: this run's resume will not be bitwise: ") and why in err[0]
    assert events(tmp_path) == [err[0].removeprefix("hpctrain: ")]
    assert events(tmp_path / "other") == []


@pytest.mark.parametrize(
    "collator",
    [
        BatchSeeded(DataCollatorForLanguageModeling(tokenizer())),
        DataCollatorForLanguageModeling(tokenizer(), mlm=False),
        DataCollatorWithPadding(tokenizer()),
        default_data_collator,
    ],
)
def test_a_collator_that_resumes_exactly_is_not_flagged(collator, tmp_path, monkeypatch, capsys):
    begin(collator, tmp_path, monkeypatch)
    assert capsys.readouterr().err == "" and events(tmp_path) == []


def test_show_lists_the_event_and_status_flags_the_running_job(tmp_path, monkeypatch, isolated_ledger):
    begin(DataCollatorForLanguageModeling(tokenizer()), tmp_path, monkeypatch)
    with Ledger(isolated_ledger) as ledger:
        job_id = Table(ledger, "jobs").insert({"name": "mlm", "site": "dev", "state": "RUNNING"})
        for name in Journal(tmp_path).names():  # as if the job had written it: its ledger id in the record
            path = tmp_path / name
            path.write_text(path.read_text().replace('"job_id": null', f'"job_id": {job_id}'))
        ingest_journal(ledger, Journal(tmp_path))
        shown = [e["message"] for e in ledger.events.of_job(job_id)]
        found = job_alerts(ledger, Table(ledger, "jobs").rows(), Alerts())
    assert len(shown) == 1 and shown[0].startswith("this run's resume will not be bitwise: the collator")
    assert found == {job_id: shown}
