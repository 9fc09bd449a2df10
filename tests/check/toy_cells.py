"""Test-only repro for tests/check/test_run.py: each rank all-reduces once and reports what it saw."""

from __future__ import annotations

import torch
import torch.distributed as dist


def run(params, ctx):
    t = torch.ones(1) * (ctx.rank + 1)
    dist.all_reduce(t)
    return {"sum": float(t.sum()), "wrap": params["wrap"]}
