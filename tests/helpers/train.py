"""Helpers for the trainer tests: a tiny spec, the single-process reference, and a torchrun worker.

Run as a module under torchrun (``torchrun ... -m helpers.train SCENARIO``, with tests/ on PYTHONPATH: ``torchrun``
below), it executes one scenario (JSON file, argv[1]) on every rank and rank 0 writes the results to the scenario's
"out" path.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.paths import REPO, tests_on_path

TORCHRUN = Path(sys.executable).with_name("torchrun")
GLOBAL_STATE = "global_state.pt"  # the restore scenario's state after k steps, assembled on rank 0
TINY_MODEL = {"layers": 4, "heads": 4, "hidden": 64, "vocab": 256, "seq_len": 32}
TEXT_BYTES = 1 << 16  # of the standard library's source, as `hpctrain data text` reads it


@functools.cache
def _text() -> bytes:
    from hpctrain.data.text import stdlib_dir, text_files, text_stream

    return text_stream(text_files([stdlib_dir()]), TEXT_BYTES)


def text_samples(model, seed: int, first: int, n: int):
    """Samples first .. first+n-1 as byte sequences of standard-library source (a ``synthetic.Source``;
    ``seed`` unused): consecutive pieces of seq_len + 1 bytes, wrapping around."""
    import torch

    size = model.seq_len + 1
    count = len(_text()) // size
    rows = [torch.frombuffer(bytearray(_text()[(i % count) * size:(i % count + 1) * size]), dtype=torch.uint8)
            for i in range(first, first + n)]
    tokens = torch.stack(rows).long()
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def source(data: str):
    """The sample source a scenario names: "synthetic" (arithmetic progressions) or "text"."""
    from hpctrain.train.synthetic import samples

    return {"synthetic": samples, "text": text_samples}[data]


def pack_text_dataset(out_dir: Path, seq_len: int, count: int, shard_bytes: int):
    """``count`` sequences of standard-library source as shards, as `hpctrain data text` packs them."""
    from hpctrain.data.text import pack_text

    return pack_text(out_dir, [], seq_len, count * (seq_len + 1), shard_bytes)[0]


def tiny_spec(dp: int = 1, tp: int = 1, pp: int = 1, **parallel: Any):
    from hpctrain.config.job import JobSpec

    return JobSpec(name="tiny", command=["python", "-m", "hpctrain.train"], seed=7, model=TINY_MODEL,
                   parallel={"dp": dp, "tp": tp, "pp": pp, "micro_batch": 2, "grad_accum": 2, **parallel},
                   hyperparameters={"lr": 1e-3})


def reference_training(spec, steps: int, data: str = "synthetic"):
    """The same model, seed and data in one process with plain torch (no DeepSpeed): (losses, model, optimizer)."""
    import torch

    from hpctrain.train.ds_config import DEFAULTS
    from hpctrain.train.model import gpt_sequential, lm_loss
    from hpctrain.train.synthetic import global_batch

    hp = {**DEFAULTS, **spec.hyperparameters}
    model = gpt_sequential(spec.model, seed=spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=hp["betas"], eps=hp["eps"],
                            weight_decay=hp["weight_decay"])
    losses = []
    for step in range(steps):
        ids, labels = global_batch(spec.model, spec.parallel, spec.seed, step, source(data))
        loss = lm_loss(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        if hp["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        opt.step()
        losses.append(loss.item())
    return losses, model, opt


def reference_losses(spec, steps: int, data: str = "synthetic") -> list[float]:
    return reference_training(spec, steps, data)[0]


def relative_errors(got: list[float], want: list[float]) -> list[float]:
    assert len(got) == len(want)
    return [abs(g - w) / abs(w) for g, w in zip(got, want)]


def reference_eval_loss(model, spec, held_out: Path) -> float:
    """The single process's mean loss on the evaluation samples ``spec`` names in the held-out index."""
    import torch

    from hpctrain.data.holdout import first_samples
    from hpctrain.data.index import load_index
    from hpctrain.train.model import lm_loss

    count = spec.eval.batches * spec.parallel.samples_per_step
    tokens = torch.stack([torch.as_tensor(s["npy"]) for s in first_samples(load_index(held_out), count)])
    with torch.no_grad():
        return lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).item()


def assemble(pieces):
    """Global tensors from every rank's (local_state, placements).

    Checks that the writers' slices tile each global tensor exactly once and that every other
    rank's copy equals what was written there.
    """
    import torch

    def box(placement, tensor):
        return tuple(slice(o, o + n) for o, n in zip(placement.offset, tensor.shape))

    full, cover = {}, {}
    for state, where in pieces:
        for name, placement in where.items():
            if placement.writer:
                local, dst = state[name], box(placement, state[name])
                full.setdefault(name, torch.zeros(placement.global_shape, dtype=local.dtype))[dst] = local
                cover.setdefault(name, torch.zeros(placement.global_shape, dtype=torch.int64))[dst] += 1
    untiled = [name for name, count in cover.items() if not (count == 1).all()]
    assert not untiled, f"writers do not tile {untiled}"
    for state, where in pieces:
        for name, placement in where.items():
            assert full[name][box(placement, state[name])].equal(state[name]), f"replicas of {name} differ"
    return full


def torchrun(nproc: int, *args: str, timeout: float = 300, env: dict[str, str] | None = None,
             fork: bool = True) -> subprocess.CompletedProcess[str]:
    """``nproc`` ranks of ``args`` (``-m MODULE ARG...``) on this machine, with torchrun's environment: forked from
    one process that imported the trainer's libraries (helpers.forkrun), or with ``fork=False`` by torchrun itself."""
    env = {**tests_on_path(), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", **(env or {})}
    launcher = [sys.executable, "-m", "helpers.forkrun", str(nproc)] if fork else [
        str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}"]
    cmd = [*launcher, *args]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{first_failure(done.stderr)}"
    return done


def train_ranks(spec: Path, steps: int, journal: Path, stderr: list[str] | None = None, nproc: int = 4,
                job_id: int = 1) -> list[dict]:
    """The step lines of ``nproc`` ranks training ``spec`` to ``steps`` with the reference trainer, journaling
    into ``journal`` as ledger job ``job_id``; their stderr appended to ``stderr``."""
    out = torchrun(nproc, "-m", "hpctrain.train", "--spec", str(spec), "--steps", str(steps),
                   env={"HPCTRAIN_JOURNAL_DIR": str(journal), "HPCTRAIN_JOB_ID": str(job_id)})
    if stderr is not None:
        stderr.append(out.stderr)
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]


def first_failure(stderr: str) -> str:
    """The lines of the rank torchrun reports as the first to fail (the others' errors follow from it)."""
    found = re.search(r"failed \(exitcode: -?\d+\) local_rank: (\d+)", stderr)
    own = [line for line in stderr.splitlines() if found and line.startswith(f"[rank{found[1]}]:")]
    return "\n".join(own)[-6000:] if own else stderr[-6000:]


def straight_run(spec: Path, steps: int, nproc: int = 4) -> None:
    """The reference trainer never interrupted, under torchrun: what an interrupted run must end as."""
    torchrun(nproc, "-m", "hpctrain.train", "--spec", str(spec), "--steps", str(steps), timeout=600)


def assert_bitwise_equal(a_dir: Path, b_dir: Path, step: int) -> None:
    """Both runs' checkpoints of ``step`` hold bit for bit the same model and optimizer state."""
    import torch

    from hpctrain.checkpoint import load_flat

    def bits(t):
        return t.reshape(-1).view(torch.uint8)

    name = f"step_{step:08d}"
    a, b = load_flat(a_dir / name), load_flat(b_dir / name)
    assert a.keys() == b.keys() and len(a) > 10
    differ = [k for k in a if not torch.equal(bits(a[k]), bits(b[k]))]
    assert not differ, differ


def run_scenario(tmp_path: Path, nproc: int, **scenario: Any) -> dict[str, Any]:
    """Run ``_worker`` on ``nproc`` ranks; returns what rank 0 wrote."""
    job, out = tmp_path / "scenario.json", tmp_path / "result.json"
    job.write_text(json.dumps({**scenario, "out": str(out)}))
    torchrun(nproc, "-m", "helpers.train", str(job))
    return json.loads(out.read_text())


def layers_rank_main(rank: int, world: int, rendezvous: str) -> None:
    """One rank of a tp=``world`` model: forward, loss and every gradient equal the unsplit model's."""
    import torch
    import torch.distributed as dist

    from hpctrain.config.job import Model
    from hpctrain.train.model import gpt_sequential, lm_loss
    from hpctrain.train.synthetic import samples

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    model = Model(**TINY_MODEL)
    split, full = gpt_sequential(model, seed=3, group=dist.group.WORLD), gpt_sequential(model, seed=3)
    ids, labels = samples(model, seed=3, first=0, n=2)
    losses = []
    for net in (split, full):
        logits = net(ids)
        loss = lm_loss(logits, labels)
        loss.backward()
        losses.append((logits.detach(), loss.detach()))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    full_params = dict(full.named_parameters())
    for name, p in split.named_parameters():
        ref, ref_grad = full_params[name].detach(), full_params[name].grad
        dim = getattr(p, "tp_split_dim", None)
        if dim is not None:
            assert p.shape[dim] * world == ref.shape[dim], name
            ref, ref_grad = ref.chunk(world, dim=dim)[rank], ref_grad.chunk(world, dim=dim)[rank]
        torch.testing.assert_close(p.detach(), ref, rtol=0, atol=0, msg=f"{name}: weights differ")
        torch.testing.assert_close(p.grad, ref_grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: grad {m}")
    dist.destroy_process_group()


def _worker(scenario: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hpctrain.config.job import JobSpec
    from hpctrain.train.engine import build_engine, train
    from hpctrain.train.state import load_local_state, local_state, placements
    from hpctrain.train.synthetic import micro_batches

    spec = JobSpec.model_validate(scenario["spec"])
    samples = source(scenario.get("data", "synthetic"))

    def batches(engine, start_step=0):
        return micro_batches(spec.model, spec.parallel, spec.seed, engine.grid.get_data_parallel_rank(), start_step,
                             samples)

    def losses(engine, data, steps):
        return [r.loss for r in train(engine, data, steps)]

    engine = build_engine(spec)
    if scenario["mode"] == "losses":
        return {"losses": losses(engine, batches(engine), scenario["steps"])}
    if scenario["mode"] == "eval":  # the held-out loss of the initial weights, then after k training steps
        from hpctrain.data.index import load_index
        from hpctrain.train.evaluation import HeldOutEval

        grid = engine.grid
        held_out = HeldOutEval(spec, load_index(scenario["held_out"]), grid.get_data_parallel_rank(),
                               grid.get_data_parallel_world_size())
        before = held_out.evaluate(engine)
        trained = losses(engine, batches(engine), scenario["k"])
        return {"before": before, "after": held_out.evaluate(engine), "losses": trained}
    if scenario["mode"] == "reshard":  # resume the spec's checkpoint dir in this layout, gather, go on n steps
        from hpctrain.train.checkpointing import TrainCheckpoints

        checkpoints = TrainCheckpoints(spec, engine, spec.checkpoint.dir)
        start = checkpoints.resume()
        checkpoints.close()
        pieces = [None] * dist.get_world_size()
        dist.all_gather_object(pieces, (local_state(engine), placements(engine)))
        if dist.get_rank() == 0:
            torch.save(assemble(pieces), Path(scenario["out"]).with_name(GLOBAL_STATE))
        return {"start": start, "losses": losses(engine, batches(engine, start_step=start), scenario["n"])}
    # restore: k steps, capture, n more steps; then a fresh engine from the capture, n steps
    k, n = scenario["k"], scenario["n"]
    data = batches(engine)
    first = losses(engine, data, k)
    captured = local_state(engine)
    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, (captured, placements(engine)))
    if dist.get_rank() == 0:
        torch.save(assemble(pieces), Path(scenario["out"]).with_name(GLOBAL_STATE))
    continued = losses(engine, data, n)
    after = local_state(engine)
    fresh = build_engine(spec)
    load_local_state(fresh, captured)
    resumed = losses(fresh, batches(fresh, start_step=k), n)
    after_resume = local_state(fresh)
    same_state = all(after[key].equal(after_resume[key]) for key in after)
    all_same = [None] * dist.get_world_size()
    dist.all_gather_object(all_same, (same_state, "torch._dynamo" in sys.modules))
    return {"first": first, "continued": continued, "resumed": resumed, "same_state": all(s for s, _ in all_same),
            "keys": sorted(captured), "dynamo": any(d for _, d in all_same)}


def _proc(pid: str, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def rank_pid(slurm_job_id: str, rank: int, program: str = "hpctrain.train") -> int | None:
    """The pid of one rank of a job running ``program`` (every dev cluster node is this host): the process its task
    shim started, not the shim, nor the rank's data-loader workers."""
    for proc in Path("/proc").iterdir():
        environ = _proc(proc.name, "environ").split(b"\0")
        cmdline = _proc(proc.name, "cmdline")
        if program.encode() in cmdline and b"hpctrain.launch.task" not in cmdline \
                and f"SLURM_JOB_ID={slurm_job_id}".encode() in environ \
                and f"SLURM_PROCID={rank}".encode() in environ:
            parent = _proc(proc.name, "stat").rpartition(b")")[2].split()[1:2]
            if parent and b"hpctrain.launch.task" in _proc(parent[0].decode(), "cmdline"):
                return int(proc.name)
    return None


def srun_pid(slurm_job_id: str) -> int | None:
    """The pid of the srun that launches a job's task shims (in its batch script, on the batch host: this host)."""
    for proc in Path("/proc").iterdir():
        argv = _proc(proc.name, "cmdline").split(b"\0")
        if argv[0].endswith(b"srun") and b"hpctrain.launch.task" in argv \
                and f"SLURM_JOB_ID={slurm_job_id}".encode() in _proc(proc.name, "environ").split(b"\0"):
            return int(proc.name)
    return None


def trainer_spec(name: str, *, seed: int, index: Path, ckpt: Path, every_steps: int, resources: dict[str, Any],
                 steps: int | None = None, parallel: str = "tp = 2\npp = 2\ngrad_accum = 2") -> str:
    """TOML of a reference-GPT spec (tp=2 x pp=2 unless ``parallel`` says otherwise) reading ``index`` and
    checkpointing into ``ckpt``."""
    command = ["python", "-m", "hpctrain.train", *(["--steps", str(steps)] if steps else [])]
    lines = [f'name = "{name}"', f"command = {json.dumps(command)}", f"seed = {seed}", "hyperparameters = { lr = 1e-3 }",
             "", "[resources]", *(f"{k} = {json.dumps(v)}" for k, v in resources.items()),
             "", "[parallel]", parallel, "micro_batch = 2",
             "", "[model]", *(f"{k} = {v}" for k, v in TINY_MODEL.items()),
             "", "[data]", f'index = "{index}"', "workers = 1",
             "", "[checkpoint]", f'dir = "{ckpt}"', f"every_steps = {every_steps}", ""]
    return "\n".join(lines)


def patched_trainer(steps: int, before_step: str) -> str:
    """Python code running the reference trainer to ``steps``, running the line ``before_step`` (with os, time, and
    the number of this step in this process, ``calls[0]``) before each step; a stack shows it at line 8, in
    `patched`."""
    return f"""\
import os, sys, time
import hpctrain.train.engine as engine
from hpctrain.train.__main__ import main

calls, train = [0], engine.train
def patched(*args, **kwargs):
    calls[0] += 1
    {before_step}
    return train(*args, **kwargs)
engine.train = patched
sys.exit(main(["--steps", "{steps}"]))
"""


if __name__ == "__main__":
    import torch.distributed as dist

    scenario = json.loads(Path(sys.argv[1]).read_text())
    result = _worker(scenario)
    if int(os.environ["RANK"]) == 0:
        Path(scenario["out"]).write_text(json.dumps(result))
    # Tearing gloo down explicitly: left to interpreter exit, its threads sometimes abort the process.
    dist.barrier()
    dist.destroy_process_group()

