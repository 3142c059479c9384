"""`hpctrain model export` streams: a checkpoint larger than the process may allocate exports, tensor by tensor, and
reads back equal; an export stopped by a signal or killed leaves nothing behind, and running it again exports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

from hpctrain.ledger import Ledger
from hpctrain.registry.versions import register

from helpers.registry import job_with_checkpoints, record_checkpoint

TENSORS, ROWS, COLS = 8, 1024, 2048  # 8 tensors of 8 MiB: 64 MiB
# The export in this process with its data segment (RLIMIT_DATA: every private writable mapping, which is where
# numpy's and tensorstore's buffers live) limited to argv[1] bytes (0: none); prints VmData at its end.
LIMITED = """
import resource, runpy, sys
limit = int(sys.argv[1])
if limit:
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
sys.argv = ["hpctrain", *sys.argv[2:]]
try:
    runpy.run_module("hpctrain", run_name="__main__")
finally:
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print("VmData", int(status["VmData"].split()[0]) * 1024, file=sys.stderr)
"""


def big(step: int) -> dict[str, np.ndarray]:
    return {f"w{i}": np.full((ROWS, COLS), step + i, dtype=np.float32) for i in range(TENSORS)}


def export(limit: int, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    done = subprocess.run([sys.executable, "-c", LIMITED, str(limit), "model", "export", *args], capture_output=True,
                          text=True, timeout=300)
    line = [x for x in done.stderr.splitlines() if x.startswith("VmData ")]
    return done, int(line[-1].split()[1]) if line else -1


def test_a_checkpoint_larger_than_the_memory_limit_exports(isolated_ledger, tmp_path):
    """The baseline: VmData at the end of exporting a tiny checkpoint (libraries, thread pools, the ledger). The
    limit: that plus half the big checkpoint's 64 MiB. Loading the tensors together cannot fit; one at a time
    (8 MiB) does."""
    with Ledger(isolated_ledger) as ledger:
        tiny = job_with_checkpoints(ledger, tmp_path, "tiny", (1,))
        register(ledger, "tiny", tiny)
        job = job_with_checkpoints(ledger, tmp_path, "big", ())
        record_checkpoint(ledger, job, -1, tmp_path / "big", 3, big(3))
        register(ledger, "big", job)
    done, baseline = export(0, "tiny", str(tmp_path / "tiny-out"))
    assert done.returncode == 0 and baseline > 0, done.stderr
    limit = baseline + TENSORS * ROWS * COLS * 4 // 2
    done, used = export(limit, "big", str(tmp_path / "out"))
    assert done.returncode == 0, f"baseline {baseline}, limit {limit}: {done.stderr[-2000:]}"
    assert used <= limit
    got = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(got) == sorted(big(3)) and all(np.array_equal(got[k], v) for k, v in big(3).items())


def test_a_stopped_or_killed_export_leaves_nothing_and_runs_again(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run", (2,))
        register(ledger, "gpt", job)
    out = tmp_path / "out"
    killed = tmp_path / f".out.tmp-{os.uname().nodename}-999999999"  # a dead process's, on this host
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    stopped = subprocess.Popen([sys.executable, "-c", f"""
import runpy, sys
import hpctrain.registry.export as export
real = export.write_safetensors
def stop(*args):
    digest = real(*args)
    print("written", flush=True)
    sys.stdin.readline()
    return digest
export.write_safetensors = stop
sys.argv = ["hpctrain", "model", "export", "gpt", {str(out)!r}]
runpy.run_module("hpctrain", run_name="__main__")
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stopped.stdout and stopped.stdout.readline() == "written\n"
    assert [p.name for p in tmp_path.glob(".out.tmp-*") if p != killed]  # its hidden folder, while it works
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) != 0
    assert [p.name for p in tmp_path.glob(".out.tmp-*") if p != killed] == [] and not out.exists()
    done = subprocess.run([sys.executable, "-m", "hpctrain", "model", "export", "gpt", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("exported gpt:1"), done.stderr
    assert list(tmp_path.glob(".out.tmp-*")) == []  # the killed one's too
    again = subprocess.run([sys.executable, "-m", "hpctrain", "model", "export", "gpt", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.startswith("already exported gpt:1"), again.stderr
