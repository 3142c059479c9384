"""`hpctrain sample SPEC`: what the reference GPT of a job spec writes after a prompt (torch imported on use)."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.cli.types import Finite, whole


@click.command()
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--prompt", default="def ", show_default=True, help="text to continue")
@click.option("--tokens", default=200, show_default=True, type=whole(1), help="bytes to generate")
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="this checkpoint (step_N directory) instead of the newest valid one of the spec's checkpoint.dir",
)
@click.option("--task", type=whole(-1), default=-1, help="an array task's checkpoints")
@click.option(
    "--temperature",
    default=0.0,
    show_default=True,
    type=Finite(0, 10),
    help="0: greedy (the most likely byte each time); above 0: draw from the softmax of logits / T",
)
@click.option("--seed", default=0, show_default=True, type=whole(0, 2**32 - 1), help="of the draws (--temperature > 0)")
def sample(
    spec: Path, prompt: str, tokens: int, checkpoint: Path | None, task: int, temperature: float, seed: int
) -> None:
    """Continue PROMPT with the byte-level reference GPT of SPEC from its newest checkpoint (CPU): greedily, or
    drawing each byte at a temperature."""
    from hpctrain.config import load_job_spec
    from hpctrain.train.sample import sample as continue_prompt

    used, text = continue_prompt(load_job_spec(spec), prompt, tokens, checkpoint, task, temperature, seed)
    click.echo(f"# {used}", err=True)
    click.echo(text)
