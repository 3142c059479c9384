"""A rank's start pays for no DeepSpeed part hpctrain does not use: DeepSpeed loads without mlflow (its autotuner's
optional tracker, here installed with the [mlflow] extra), and mlflow still imports afterwards; starting the
process group probes no op builder (setuptools and a compiler, run by DeepSpeed's first read of its op table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.rendezvous import agent_store

PROBE = """
import json, sys
import hpctrain.train.engine
loaded = sorted(m for m in ("mlflow", "pandas") if m in sys.modules)
import mlflow
print(json.dumps({"loaded": loaded, "mlflow_after": mlflow.MlflowClient.__name__}))
"""


def test_the_engine_imports_deepspeed_without_mlflow_and_mlflow_still_imports():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"loaded": [], "mlflow_after": "MlflowClient"}


INIT = """
import sys
from hpctrain.train.engine import init_distributed
init_distributed()
import deepspeed
print(sorted(m for m in ("setuptools", "deepspeed.ops.op_builder.all_ops") if m in sys.modules))
print(deepspeed.ops.__compatible_ops__)
"""


def test_starting_the_process_group_probes_no_deepspeed_op_and_builds_no_shared_memory_op():
    store, meet = agent_store()
    env = {**os.environ, **meet, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", INIT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-2:] == ["[]", "{'deepspeed_shm_comm': False}"]
