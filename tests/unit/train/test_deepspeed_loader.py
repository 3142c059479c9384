"""DeepSpeed loads without mlflow (its autotuner's optional tracker, here installed with the [mlflow] extra): a rank's
start does not pay for it, and mlflow still imports afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

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
