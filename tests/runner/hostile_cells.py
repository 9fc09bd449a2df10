"""Test-only hostile repros: cells that leave the rank's process changed, or answer in ways a repro must not,
to prove that every later cell of the same launch still gets its true verdict.

``probe`` is the victim: a healthy cell that fails (raises) when it meets any change a hostile cell could leave
behind; in a clean process it trains one AdamW step and returns ``{"sum": ...}``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

INJECTED_PATH = "/hostile-injected-path"
LEAKED_ENV = ("ACCELERATE_USE_FSDP", "FSDP_SHARDING_STRATEGY", "ACCELERATE_MIXED_PRECISION")
"""Variables that steer accelerate's / transformers' FSDP choices: never seen by a rank unless a cell sets them."""
STEERING_ENV = ("TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE", "CUDA_LAUNCH_BLOCKING", "TORCH_DISTRIBUTED_DEBUG")
"""Variables that change what a cell exercises (runner/protocol.py): never seen by a rank either."""


def _collective(ctx) -> float:
    t = torch.ones(4, device=ctx.device) * (ctx.rank + 1)
    dist.all_reduce(t)
    return float(t.sum())


def _probe(ctx) -> dict:
    problems = []
    layer = torch.nn.Linear(4, 4)
    before = layer.weight.detach().clone()
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(2, 4)).sum().backward()
    opt.step()
    if torch.equal(before, layer.weight.detach()):
        problems.append("AdamW.step did not change the weights")
    warnings.warn("probe: a deprecation warning is a warning, not an error", DeprecationWarning, stacklevel=1)
    leaked = [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_")) and not k.startswith("FSDP_MATRIX_")]
    leaked += [k for k in STEERING_ENV if k in os.environ]
    if leaked:
        problems.append(f"leaked env: {leaked}")
    for need in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if need not in os.environ:
            problems.append(f"{need} missing")
    if INJECTED_PATH in sys.path:
        problems.append("sys.path changed")
    if torch.is_anomaly_enabled():
        problems.append("anomaly mode on")
    if torch.get_float32_matmul_precision() != "highest":
        problems.append(f"matmul precision {torch.get_float32_matmul_precision()}")
    if torch.get_default_dtype() != torch.float32 or not torch.is_grad_enabled():
        problems.append("torch defaults changed")
    if Path.cwd().name == "hostile-chdir":
        problems.append("cwd changed")
    if problems:
        raise AssertionError("probe met a tainted process: " + "; ".join(problems))
    return {"sum": _collective(ctx)}


def run(params, ctx):
    fault = params["fault"]
    if fault == "probe":
        return _probe(ctx)
    total = _collective(ctx)
    if fault == "ret_bool":
        return True
    if fault == "ret_list":
        return [1, 2, 3]
    if fault == "ret_bad_keys":
        return {("not", "a", "json", "key"): 1}
    if fault == "patch_adamw":
        torch.optim.AdamW.step = lambda self, closure=None: None
    elif fault == "warn_error":
        warnings.simplefilter("error")
    elif fault == "sys_path":
        sys.path.insert(0, INJECTED_PATH)
    elif fault == "anomaly":
        torch.autograd.set_detect_anomaly(True)
    elif fault == "matmul":
        torch.set_float32_matmul_precision("medium")
    elif fault == "set_env":
        os.environ["ACCELERATE_USE_FSDP"] = "true"
    elif fault == "chdir":
        target = Path(ctx.scratch) / "hostile-chdir"
        target.mkdir(exist_ok=True)
        os.chdir(target)
    elif fault == "big_error":
        sys.stdout.write("x" * (2 << 20) + "\n")
        raise RuntimeError("huge message head " + "y" * (8 << 20) + " huge message tail")
    elif fault == "child_forever":
        # ignores SIGTERM and sleeps: only a SIGKILL ends it
        subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 600"])
    return {"sum": total}
