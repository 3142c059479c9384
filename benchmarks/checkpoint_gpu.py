"""Checkpoints of a GPU-resident state: hpctrain vs torch.save/torch.load, same bytes, same disk; async stall.

    python benchmarks/checkpoint_gpu.py [--size-mb 1024] [--tensors 16] [--repeats 5] [--dir DIR]

Needs a CUDA GPU. The state is bf16 and fp32 tensors on the GPU (half the bytes each), as a mixed
precision trainer holds them. Cases, each repeat in a rotated order, page cache evicted before reads:
  hpctrain save        sync save from the GPU (copy to pinned host buffers, write, commit)
  torch.save           torch.save of the GPU tensors (copies them to the host itself), fsynced
  hpctrain load        load(path, like): in place into the GPU tensors
  torch.load           torch.load(map_location="cuda")
Async stall: the seconds a training step is blocked per save(async_=True, copy="background") while
``--step-s`` of GPU matrix products run (the device-to-host copy runs on a side stream meanwhile), and
as a fraction of a sync save; and with copy="now" (the copy before save returns).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from _figures import figure
from checkpoint_io import time_groups, time_table, torch_save
from hpctrain.checkpoint import Checkpointer, Retention, load
from hpctrain.checkpoint.naming import committed_name


def gpu_step(ck: Checkpointer, step: int, state: dict[str, torch.Tensor], compute_s: float, copy: str) -> float:
    """One training step saving the state it starts from; the time the host was blocked by the save."""
    start = time.perf_counter()
    ck.save(step, state, async_=True, copy=copy)
    blocked = time.perf_counter() - start
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    while time.perf_counter() - start < compute_s:  # forward and backward, not touching the state
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    start = time.perf_counter()
    ck.wait_snapshot()
    blocked += time.perf_counter() - start
    with torch.no_grad():  # the optimizer step
        for t in state.values():
            t.add_(1)
    torch.cuda.synchronize()
    return blocked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.5, help="forward+backward time of a step (default 0.5 s)")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (a temp dir is made inside)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("checkpoint_gpu: needs a CUDA GPU")

    per = (args.size_mb << 20) // args.tensors
    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {f"layer{i}": torch.randn(per // 2 if i % 2 else per // 4, device="cuda", generator=gen,
                                      dtype=torch.bfloat16 if i % 2 else torch.float32) for i in range(args.tensors)}
    nbytes = sum(t.nbytes for t in state.values())
    work = Path(tempfile.mkdtemp(prefix="hpctrain-bench-", dir=args.dir))
    t: dict[str, list[float]] = {k: [] for k in ("hpctrain save", "torch.save", "hpctrain load", "torch.load",
                                                 "stall (copy now)", "stall (background copy)")}
    pt = work / "state.pt"
    like = {k: torch.empty_like(v) for k, v in state.items()}
    saves = ("now", "now", "background", "background")  # the async saves of each repeat
    try:
        ck = Checkpointer(work / "ck", retention=Retention(keep_last=1), journal=None)
        for repeat in range(args.repeats):
            first = repeat * (1 + len(saves)) + 1  # this repeat's first step
            path = ck.directory / committed_name(first)
            groups = {"torch": [("torch.save", None, lambda: torch_save(pt, state)),
                                ("torch.load", pt, lambda: torch.load(pt, map_location="cuda", weights_only=True))],
                      "hpctrain": [("hpctrain save", None, lambda: ck.save(first, state).result()),
                                   ("hpctrain load", path, lambda: load(path, like))]}
            time_groups({k: [(name, files, lambda fn=fn: (fn(), torch.cuda.synchronize())) for name, files, fn in v]
                         for k, v in groups.items()}, repeat, t, before=torch.cuda.synchronize)
            pt.unlink()
            with Checkpointer(ck.directory, retention=Retention(keep_last=1), journal=None) as saver:
                for i, copy in enumerate(saves):
                    stall = gpu_step(saver, first + 1 + i, state, args.step_s, copy)
                    saver.wait()
                    if i:  # the first save of a Checkpointer allocates its pinned buffers
                        t[f"stall ({'copy now' if copy == 'now' else 'background copy'})"].append(stall)
        ck.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"state on {torch.cuda.get_device_name()}: {args.tensors} fp32/bf16 tensors, {nbytes / 2**20:.0f} MiB; "
          f"{args.repeats} repeats; dir {args.dir}")
    med, best = time_table(t, ("hpctrain save", "torch.save", "hpctrain load", "torch.load"), nbytes)
    for k in ("stall (copy now)", "stall (background copy)"):
        print(f"{k:32} {med[k]:8.3f} {'':6}   {best[k]:8.3f}")
    for case, other in (("hpctrain save", "torch.save"), ("hpctrain load", "torch.load")):
        ratio = best[other] / best[case]
        print(f"{case} / {other} rate: median {med[other] / med[case]:.2f}x, best {ratio:.2f}x")
        figure(f"GPU state: {case} / {other} rate, {nbytes >> 20} MiB (best of {args.repeats})", ratio, "x",
               ">= 1 x", ratio >= 1)
    for copy, goal in (("background copy", 5.0), ("copy now", None)):
        k = f"stall ({copy})"
        share = 100 * med[k] / med["hpctrain save"]
        print(f"{k} / sync save: {share:.1f}%")
        figure(f"GPU state: step blocked per async save, {copy} (median; {args.step_s} s steps)", med[k], "s")
        figure(f"GPU state: async save {k} / sync save (median; {args.step_s} s steps)", share, "%",
               f"<= {goal:g} %" if goal else "", share <= goal if goal else None)


if __name__ == "__main__":
    main()
