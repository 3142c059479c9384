"""A Hugging Face `Trainer` run, preemption-safe with hpctrain in three lines (see hpctrain.integrations.hf).

    python hf_trainer.py OUTPUT_DIR [--steps 200] [--step-s 0] [--progress FILE] [--mlm]

A tiny GPT-2 built from a config (randomly initialised, no download) learns random byte sequences on
the CPU, evaluated every 50 steps on sequences it never trains on; the callback journals the Trainer's
logged values (loss, learning rate, eval/loss, ...) into the job's ledger. Run it as the command of an hpctrain job spec: on the notice the Trainer saves its checkpoint
of that step and stops, the script exits, hpctrain's batch script requeues the job, and the next run
resumes from the checkpoint. The final weights go to OUTPUT_DIR/final. ``--step-s`` slows each step
down and ``--progress`` appends each step's number to FILE: both only to watch a preemption happen.
``--mlm`` trains on randomly masked tokens instead (`DataCollatorForLanguageModeling` with a byte-level
tokenizer built in memory, 2 DataLoader workers, 4 batches accumulated per step, a cosine schedule after a
warm-up): the collator is wrapped in hpctrain's `BatchSeeded`, which a resume mid-epoch needs to stay exact.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import (
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from hpctrain.integrations.hf import BatchSeeded, HpctrainCallback, last_checkpoint

from _watch import arguments, record


class Pace(TrainerCallback):
    def __init__(self, step_s: float, progress: Path | None):
        self.step_s, self.progress = step_s, progress

    def on_step_end(self, args, state, control, **kwargs):
        record(self.progress, state.global_step)
        time.sleep(self.step_s)


def dataset(count: int = 512, seq_len: int = 32, seed: int = 0, labels: bool = True) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (count, seq_len), generator=g)
    return [{"input_ids": t, "labels": t} if labels else {"input_ids": t} for t in tokens]


def masking_collator() -> BatchSeeded:
    """MLM masking over bytes: a word-level tokenizer of 256 byte tokens, [MASK] and [PAD], made in memory."""
    from tokenizers import Tokenizer, models

    vocab = {**{f"b{i}": i for i in range(256)}, "[MASK]": 256, "[PAD]": 257}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[PAD]")),
                                        mask_token="[MASK]", pad_token="[PAD]")
    return BatchSeeded(DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15))


def main() -> int:
    parser = arguments(__doc__, "output_dir")
    parser.add_argument("--mlm", action="store_true", help="random masking, 2 workers, accumulation, cosine")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=258 if args.mlm else 256, n_positions=32, n_embd=32, n_layer=2,
                                       n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    schedule = dict(gradient_accumulation_steps=4, lr_scheduler_type="cosine", warmup_steps=5,
                    dataloader_num_workers=2) if args.mlm else dict(dataloader_num_workers=0)
    training = TrainingArguments(
        output_dir=str(args.output_dir), max_steps=args.steps, per_device_train_batch_size=8, learning_rate=1e-3,
        save_strategy="steps", save_steps=50, save_total_limit=2, logging_steps=25, report_to=[], seed=0,
        eval_strategy="steps", eval_steps=50, per_device_eval_batch_size=32,
        use_cpu=True, disable_tqdm=True, **schedule)
    hpctrain = HpctrainCallback()
    trainer = Trainer(model=model, args=training, train_dataset=dataset(labels=not args.mlm),
                      eval_dataset=dataset(64, seed=1, labels=not args.mlm),
                      data_collator=masking_collator() if args.mlm else None,
                      callbacks=[hpctrain, Pace(args.step_s, args.progress)])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))
    if hpctrain.stopped:
        print(f"stopped on the notice at step {trainer.state.global_step}: checkpoint saved", flush=True)
        return 0
    trainer.save_model(str(args.output_dir / "final"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
