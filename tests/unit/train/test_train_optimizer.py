"""The reference trainer's AdamW (hpctrain.train.optimizer) is torch's without torch._dynamo: the same weights and
state bit for bit, through param groups, zero_grad, and a state_dict saved and loaded; and nothing imports
torch._dynamo (a rank trained, saved and resumed by DeepSpeed: test_train_parallel's restore scenario)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import torch
from hpctrain.train.optimizer import AdamW

def run(cls):
    torch.manual_seed(0)
    w, b = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))
    def made():
        opt = cls([w], lr=1e-2, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1)
        opt.add_param_group({"params": [b], "weight_decay": 0.0})
        return opt
    def steps(opt, n):
        for i in range(n):
            opt.zero_grad()
            ((w.sum(0) * b).square().sum() * (i + 1)).backward()
            opt.step()
    first = made()
    steps(first, 3)
    again = made()
    again.load_state_dict(first.state_dict())
    steps(again, 2)
    return [w.detach().clone(), b.detach().clone(), again.state_dict()]

def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

ours = run(AdamW)
dynamo = "torch._dynamo" in sys.modules
theirs = run(torch.optim.AdamW)
print(json.dumps({"dynamo": dynamo, "same": same(ours, theirs), "theirs_import_dynamo": "torch._dynamo" in sys.modules}))
"""


def test_adamw_is_torchs_bit_for_bit_without_importing_torch_dynamo():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"dynamo": False, "same": True, "theirs_import_dynamo": True}
