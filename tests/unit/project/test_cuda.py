"""The CUDA paths: checkpoints of GPU tensors (pinned copies on a side stream, in-place loads onto the
GPU, CUDA RNG state), the reference trainer on one GPU with NCCL, fp32 and bf16, stopped by a
preemption notice and resumed bitwise, and the GPU benchmarks' figures (MFU, seconds blocked per save).

Skipped without a GPU: run ``pytest tests/unit/project/test_cuda.py`` on a GPU node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint import Checkpointer, capture_rng_state, load, restore_rng_state
from hpctrain.checkpoint.format import to_torch
from hpctrain.launch.preflight import NCCL_SIZES

from helpers.checkpoint import same_bits, special_array
from helpers.paths import REPO
from helpers.train import TINY_MODEL, assert_bitwise_equal

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU ")

DTYPES = ["float32", "bfloat16", "float16", "int64", "bool"]


def cuda_state(seed: int = 0) -> dict[str, torch.Tensor]:
    return {d: to_torch(special_array(d, (257, 33), seed=seed + i)).cuda() for i, d in enumerate(DTYPES)}


@pytest.mark.parametrize("copy", ["now", "background"])
def test_gpu_tensors_round_trip_bit_exact_onto_the_host_and_in_place_onto_the_gpu(tmp_path, copy):
    state = cuda_state()
    with Checkpointer(tmp_path, journal=None) as ck:
        ck.save(1, state, async_=True, copy=copy)
        ck.wait_snapshot()
        path = ck.wait()
    assert path is not None
    back = load(path)
    like = {d: torch.empty_like(t) for d, t in state.items()}
    filled = load(path, like)
    for d, t in state.items():
        assert back[d].device.type == "cpu" and same_bits(back[d], t.cpu()), d
        assert filled[d] is like[d] and like[d].is_cuda and same_bits(like[d].cpu(), t.cpu()), d


def test_a_save_holds_what_the_gpu_computed_before_it_and_not_what_it_computes_after(tmp_path):
    """The copy runs on a side stream: it must wait for work queued before save, and training's next
    in-place update must wait for the copy (wait_snapshot)."""
    t = torch.zeros(1 << 22, device="cuda")
    with Checkpointer(tmp_path, journal=None) as ck:
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued ahead of the fill
        t.fill_(7.0)
        ck.save(1, {"t": t}, async_=True, copy="background")
        ck.wait_snapshot()
        t.add_(1.0)
        path = ck.wait()
    assert bool((load(path)["t"] == 7.0).all())
    assert bool((t == 8.0).all())


def test_cuda_rng_state_restores_the_same_draws():
    torch.cuda.manual_seed(3)
    torch.rand(1, device="cuda")
    state = json.loads(json.dumps(capture_rng_state()))
    assert "cuda" in state
    first = torch.rand(8, device="cuda")
    restore_rng_state(state)
    assert torch.equal(torch.rand(8, device="cuda"), first)


def gpu_spec(path: Path, precision: str, ckpt: Path) -> Path:
    lines = ['name = "gpu"', 'command = ["python", "-m", "hpctrain.train"]', "seed = 7",
             "hyperparameters = { lr = 1e-3 }", "", "[resources]", "gpus_per_node = 1",
             "", "[parallel]", "micro_batch = 2", "grad_accum = 2", f'precision = "{precision}"',
             "", "[model]", *(f"{k} = {v}" for k, v in TINY_MODEL.items()),
             "", "[checkpoint]", f'dir = "{ckpt}"', "every_steps = 2", ""]
    path.write_text("\n".join(lines))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_rank_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.pop("DS_ACCELERATOR", None)
    return env


def test_network_preflight_all_reduces_over_nccl():
    env = {**one_rank_env(), "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1"}
    done = subprocess.run([sys.executable, "-m", "hpctrain.launch.preflight"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    reports = [json.loads(line.removeprefix("PREFLIGHT ")) for line in done.stdout.splitlines()
               if line.startswith("PREFLIGHT ")]
    assert len(reports) == 1 and "error" not in reports[0], done.stdout + done.stderr[-2000:]
    assert (reports[0]["backend"], reports[0]["sum"]) == ("nccl", 1)
    measured = reports[0]["bandwidth"]
    assert [m["bytes"] for m in measured] == list(NCCL_SIZES)
    assert all(m["algbw_gb_s"] > 0 and m["busbw_gb_s"] == 0 for m in measured)  # one rank: no link to cross


def benchmark_figures(script: str, *args: str) -> dict[str, dict]:
    """The FIGURE lines of ``benchmarks/<script>.py ARGS``, by name."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    figures = [json.loads(line.removeprefix("FIGURE ")) for line in done.stdout.splitlines()
               if line.startswith("FIGURE ")]
    return {f["name"]: f for f in figures}


def test_gpt_mfu_of_a_small_gpt_in_bf16():
    figures = benchmark_figures("gpt_mfu", "--tiny", "--steps", "3", "--warmup", "1", "--peak-tflops", "100")
    by_kind = {name.split(",")[0]: f for name, f in figures.items()}
    tflops, mfu = by_kind["model TFLOP/s"], by_kind["MFU"]
    assert mfu["name"].endswith(", bf16") and tflops["value"] > 0
    assert mfu["value"] == pytest.approx(tflops["value"])  # percent of 100 TFLOP/s


def test_async_gpu_checkpoint_reports_seconds_blocked_per_save(tmp_path):
    step_s = 0.2
    figures = benchmark_figures("checkpoint_gpu", "--size-mb", "64", "--tensors", "4", "--repeats", "1",
                                "--step-s", str(step_s), "--dir", str(tmp_path))
    for copy in ("background copy", "copy now"):
        blocked = figures[f"GPU state: step blocked per async save, {copy} (median; {step_s} s steps)"]
        assert blocked["unit"] == "s" and 0 < blocked["value"] < step_s, blocked


def train_on_gpu(spec: Path, steps: int, journal: Path, *, notice_after: int | None = None) -> tuple[list[dict], str]:
    """One rank of the trainer on the GPU (NCCL); with ``notice_after``, sent the preemption notice (USR2)
    once it reports that step. Its step lines and stderr."""
    env = {**one_rank_env(), "HPCTRAIN_JOURNAL_DIR": str(journal), "HPCTRAIN_JOB_ID": "1",
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "hpctrain.train", "--spec", str(spec), "--steps", str(steps)],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        lines = []
        for line in proc.stdout:
            if line.startswith("{"):
                lines.append(json.loads(line))
                if lines[-1]["step"] == notice_after:
                    proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=600) == 0
        err.seek(0)
        stderr = err.read()
    return lines, stderr


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trainer_on_a_gpu_stopped_by_a_notice_resumes_bitwise(tmp_path, precision):
    stopped = gpu_spec(tmp_path / "stopped.toml", precision, tmp_path / "ck-stopped")
    straight = gpu_spec(tmp_path / "straight.toml", precision, tmp_path / "ck-straight")
    first, err = train_on_gpu(stopped, 6, tmp_path / "j1", notice_after=2)
    assert "checkpointed, exiting" in err and len(first) < 6, err[-3000:]
    resumed, err = train_on_gpu(stopped, 6, tmp_path / "j1")
    assert f"resumed at step {len(first)}" in err, err[-3000:]
    whole, _ = train_on_gpu(straight, 6, tmp_path / "j2")
    assert [s["step"] for s in first + resumed] == [1, 2, 3, 4, 5, 6]
    assert [s["loss"] for s in first + resumed] == [s["loss"] for s in whole]
    assert_bitwise_equal(tmp_path / "ck-stopped", tmp_path / "ck-straight", 6)
    metrics = [json.loads(p.read_text()) for p in sorted((tmp_path / "j2").glob("*.json"))]
    gpu_mem = [m["values"]["gpu_mem_gb"] for m in metrics if m["kind"] == "metrics"]
    assert len(gpu_mem) == 6 and min(gpu_mem) > 0, "the trainer did not run on the GPU"


GPU_BUSY = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda")
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def _smi_util() -> float:
    out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def test_nvml_reads_a_matmul_loop_busy_and_a_sleeping_gpu_idle_as_nvidia_smi_does():
    """The node sampler's NVML source (issue 61) on GPU 0, against nvidia-smi: >= 90 % under a matmul loop,
    <= 5 % while the process holding it sleeps, each within 10 points of nvidia-smi's reading beside it."""
    import time

    from hpctrain.runtime.utilization import NvmlSource

    source = NvmlSource(["0"])
    try:
        busy = subprocess.Popen([sys.executable, "-c", GPU_BUSY, "12"], stdout=subprocess.PIPE, text=True)
        assert busy.stdout is not None and busy.stdout.readline().strip() == "ready"
        time.sleep(3)
        readings = [(source.read()[0].util, _smi_util(), time.sleep(1))[:2] for _ in range(5)]
        busy.wait()
        assert all(mine is not None and mine >= 90 and abs(mine - smi) <= 10 for mine, smi in readings), readings
        held = subprocess.Popen([sys.executable, "-c", "import time, torch; torch.zeros(1, device='cuda'); "
                                 "print('ready', flush=True); time.sleep(8)"], stdout=subprocess.PIPE, text=True)
        assert held.stdout is not None and held.stdout.readline().strip() == "ready"
        time.sleep(3)
        readings = [(source.read()[0].util, _smi_util(), time.sleep(1))[:2] for _ in range(3)]
        held.wait()
        assert all(mine is not None and mine <= 5 and abs(mine - smi) <= 10 for mine, smi in readings), readings
    finally:
        source.close()


def test_a_session_whose_kernel_spins_on_the_cpu_with_its_gpu_untouched_is_ended_as_idle(tmp_path):
    """Issue 61: a kernel busy on the CPU alone, its GPU held and untouched (a tensor on it, nothing computed). NVML
    reads the GPU idle, so the node's sampler ends the session after its idle_minutes, once, cause idle."""
    import time

    from hpctrain.config.policies import IdlePolicy
    from hpctrain.contract import JOB_DIR_ENV, JobEnvironment
    from hpctrain.interactive.spec import session_spec
    from hpctrain.ledger.journal import Journal
    from hpctrain.runtime.idle_cancel import IdleCancel
    from hpctrain.runtime.utilization import NodeSampler, NvmlSource, idle_end

    (tmp_path / "job").mkdir()
    env = JobEnvironment({JOB_DIR_ENV: str(tmp_path / "job"), "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1",
                          "SLURM_RESTART_COUNT": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_PROCID": "0"})
    journal, cancelled = Journal(tmp_path / "journal"), []
    end = idle_end(IdlePolicy().resolved(), session_spec(idle_minutes=0.1).interactive, "nvml")
    assert end == (6.0, "the session's idle_minutes = 0.1")
    kernel = subprocess.Popen([sys.executable, "-c", "import time, torch; torch.zeros(1, device='cuda'); "
                               "print('ready', flush=True); end = time.time() + 60\nwhile time.time() < end: pass"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout is not None and kernel.stdout.readline().strip() == "ready"
        sampler = NodeSampler(NvmlSource(["0"]), lambda record: None, sample_s=0.5, below_percent=5,
                              after_minutes=0, alert_minutes=1, idle_cancel=IdleCancel(env, *end, journal,
                                                                                       cancelled.append))
        sampler.start()
        deadline = time.time() + 30
        while not sampler.cancelled and time.time() < deadline:
            time.sleep(0.5)
        sampler.stop()
        assert kernel.poll() is None  # the kernel was busy all along, on the CPU
    finally:
        kernel.kill()
        kernel.wait()
    (decided,) = [rec for _, rec in journal.records(kinds=("idle_cancel",))]
    assert decided["cause"] == "idle" and cancelled == ["77"], decided
