"""`hpctrain sample`: the reference GPT's continuation (greedy or drawn) from the newest checkpoint, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.checkpoint import Checkpointer
from hpctrain.config.job import Model
from hpctrain.train.model import gpt_sequential
from hpctrain.train.sample import continuation

from helpers.cli import run_cli

MODEL = {"layers": 2, "heads": 2, "hidden": 16, "vocab": 256, "seq_len": 8}


def write_spec(tmp_path: Path, ckpt: Path, **model: int) -> Path:
    spec = tmp_path / f"{ckpt.name}-{len(list(tmp_path.glob('*.toml')))}.toml"
    spec.write_text('name = "s"\ncommand = ["true"]\n[model]\n'
                    + "".join(f"{k} = {v}\n" for k, v in {**MODEL, **model}.items())
                    + f'[checkpoint]\ndir = "{ckpt}"\n')
    return spec


def save(ckpt: Path, step: int, net: torch.nn.Module) -> None:
    """Weights under the trainer's names (``model.<param>``), with an optimizer tensor beside them."""
    state = {f"model.{k}": v for k, v in net.state_dict().items()}
    with Checkpointer(ckpt, journal=None) as ck:
        ck.save(step, {**state, "optim.exp_avg.0.tokens": torch.zeros(3)})


def test_sample_continues_with_the_newest_checkpoints_weights(tmp_path):
    old, new = gpt_sequential(Model(**MODEL), seed=1), gpt_sequential(Model(**MODEL), seed=2)
    save(tmp_path / "ck", 10, old)
    save(tmp_path / "ck", 20, new)
    spec = write_spec(tmp_path, tmp_path / "ck")
    done = run_cli("sample", str(spec), "--prompt", "def f(x):", "--tokens", "12")
    assert done.returncode == 0, done.stderr
    want = continuation(new.eval(), b"def f(x):", 12, window=8)
    assert want != continuation(old.eval(), b"def f(x):", 12, window=8)  # the weights decide the text
    assert done.stdout == want.decode(errors="replace") + "\n"
    assert done.stderr == f"# {tmp_path / 'ck' / 'step_00000020'}\n"
    older = run_cli("sample", str(spec), "--prompt", "def f(x):", "--tokens", "12",
                    "--checkpoint", str(tmp_path / "ck" / "step_00000010"))
    assert older.stdout == continuation(old.eval(), b"def f(x):", 12, window=8).decode(errors="replace") + "\n"
    drawn = run_cli("sample", str(spec), "--prompt", "def f(x):", "--tokens", "12", "--temperature", "0.8", "--seed", "3")
    assert drawn.stdout == continuation(new.eval(), b"def f(x):", 12, 8, 0.8, 3).decode(errors="replace") + "\n"


def test_a_draw_is_repeatable_by_seed_and_greedy_as_the_temperature_falls():
    net = gpt_sequential(Model(**MODEL), seed=1).eval()
    draws = {seed: continuation(net, b"x = ", 40, 8, temperature=1.0, seed=seed) for seed in range(3)}
    assert continuation(net, b"x = ", 40, 8, temperature=1.0, seed=1) == draws[1]
    assert len(set(draws.values())) == 3
    assert continuation(net, b"x = ", 40, 8, temperature=1e-4, seed=2) == continuation(net, b"x = ", 40, 8)


def test_sample_errors_are_one_line(tmp_path):
    cases = [
        (write_spec(tmp_path, tmp_path / "none"), f"{tmp_path / 'none'}: no committed checkpoint yet"),
        (write_spec(tmp_path, tmp_path / "none", vocab=300), "model.vocab = 300: sampling decodes bytes"),
    ]
    save(tmp_path / "small", 5, gpt_sequential(Model(**MODEL), seed=1))
    cases.append((write_spec(tmp_path, tmp_path / "small", hidden=32), "does not fit the spec's [model]"))
    for spec, message in cases:
        done = run_cli("sample", str(spec))
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr
