"""Model FLOPs utilisation (MFU) of the reference GPT's training step on one GPU.

    python benchmarks/gpt_mfu.py [--batch 8] [--steps 10] [--warmup 3] [--peak-tflops T] [--compile]
    python benchmarks/gpt_mfu.py --device cpu --tiny     # the same code path in seconds, no goal

The model is hpctrain.train.model's GPT (fused attention: F.scaled_dot_product_attention), by default
24 layers, hidden 1024, 16 heads, sequence 2048, vocabulary 32768 (~371M parameters), trained in
bf16 autocast on CUDA (fp32 on the CPU) by plain steps: forward, backward, AdamW, timed after warm-up.

Model FLOPs per token are PaLM's (appendix B) 6 N + 12 L d s: N the parameters outside the
embedding tables (lookups do no matmul), L layers, d hidden, s sequence; the attention term counts
the whole score matrix, causal mask or not. torch.utils.flop_counter counts one untimed step as a check;
on a GPU it also counts the fused attention's backward recomputing the scores (2 L d s more per token:
1.04 of the formula at the default size), work that MFU leaves out.
MFU = model FLOPs per second / the GPU's dense bf16 peak (PEAK_TFLOPS by device name, or --peak-tflops).
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from _figures import figure
from hpctrain.config.job import Model
from hpctrain.train.model import Embedding, gpt_sequential, lm_loss

SIZES = {"realistic": Model(layers=24, heads=16, hidden=1024, vocab=32768, seq_len=2048),
         "tiny": Model(layers=2, heads=4, hidden=64, vocab=256, seq_len=128)}
# Dense bf16 tensor-core peaks (TFLOP/s) from the vendor's data sheets; the first name found in the device's wins.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))
MFU_GOAL = 40.0


def peak_tflops(device_name: str) -> float | None:
    return next((peak for name, peak in PEAK_TFLOPS if name in device_name), None)


def matmul_params(net: nn.Module) -> int:
    """N of the formula: every parameter but the embedding tables."""
    lookups = sum(p.numel() for m in net.modules() if isinstance(m, Embedding) for p in m.parameters())
    return sum(p.numel() for p in net.parameters()) - lookups


def flops_per_token(n: int, model: Model) -> int:
    """PaLM's model FLOPs per token of a training step (forward and backward)."""
    return 6 * n + 12 * model.layers * model.hidden * model.seq_len


def train_step(net: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor,
               dtype: torch.dtype) -> None:
    with torch.autocast(ids.device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = lm_loss(net(ids), labels)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def counted_flops(net: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor,
                  dtype: torch.dtype) -> int:
    """torch.utils.flop_counter's count of one training step."""
    # the counter does not know the CPU's fused attention kernel; the math one is plain matmuls
    kernel = nullcontext() if ids.is_cuda else sdpa_kernel(SDPBackend.MATH)
    with kernel, FlopCounterMode(display=False) as counter:
        train_step(net, opt, ids, labels, dtype)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, sequence 128: checks the code path")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the counted one (default 3)")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak (default: by GPU name; none on a CPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpt_mfu: no CUDA GPU here (try --device cpu --tiny)")
    cuda = device.type == "cuda"
    model = SIZES["tiny" if args.tiny else "realistic"]
    dtype, precision = (torch.bfloat16, "bf16") if cuda else (torch.float32, "fp32")
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = args.peak_tflops or (peak_tflops(device_name) if cuda else None)

    net = gpt_sequential(model, seed=0).to(device)
    total, n = sum(p.numel() for p in net.parameters()), matmul_params(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=cuda)
    step_net = torch.compile(net) if args.compile else net
    gen = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(model.vocab, (args.batch, model.seq_len), generator=gen).to(device) for _ in "il")
    tokens = args.batch * model.seq_len
    per_token = flops_per_token(n, model)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    counted = counted_flops(net, opt, ids, labels, dtype) / tokens  # eager: the counter sees no compiled kernels
    for _ in range(args.warmup):
        train_step(step_net, opt, ids, labels, dtype)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step(step_net, opt, ids, labels, dtype)
    sync()
    step_s = (time.perf_counter() - start) / args.steps
    achieved = per_token * tokens / step_s

    name = f"~{total / 1e6:.3g}M GPT, seq {model.seq_len}, {precision}"
    print(f"GPT: {model.layers} layers, hidden {model.hidden}, {model.heads} heads, seq {model.seq_len}, "
          f"vocab {model.vocab}: {total / 1e6:.1f}M parameters, N = {n / 1e6:.1f}M outside the embedding tables")
    print(f"FLOPs per token: 6N + 12*L*d*seq (PaLM) = {per_token / 1e9:.4g} G; torch.utils.flop_counter "
          f"counted {counted / 1e9:.4g} G over one step ({counted / per_token:.3f} of the formula)")
    memory = f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if cuda else ""
    print(f"{device_name}, {precision}{', compiled' if args.compile else ''}, batch {args.batch} x {model.seq_len} "
          f"tokens: {step_s * 1e3:.1f} ms per step, {tokens / step_s:,.0f} tokens/s, "
          f"{achieved / 1e12:.3g} model TFLOP/s{memory}")
    figure(f"model TFLOP/s, {name}, {device_name}", achieved / 1e12, "TFLOP/s")
    if peak:
        mfu = 100 * achieved / 1e12 / peak
        print(f"MFU: {mfu:.1f} % of {peak:g} TFLOP/s")
        goal = cuda and not args.tiny
        figure(f"MFU, {name}", mfu, "%", f">= {MFU_GOAL:g} %" if goal else "", mfu >= MFU_GOAL if goal else None)


if __name__ == "__main__":
    main()
