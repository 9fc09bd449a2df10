"""Test-only cells for layouts (tests/runner/test_nodes.py): where a rank runs, and faults on a node other than 0.

``probe``: ``where`` reports, from rank 0, what every rank saw (its rank, node, scratch, shared folder, rendezvous
address) and what its node's scratch held after this node's local rank 0 wrote it; ``exit_rank3`` and
``hang_rank2`` misbehave on node 1 of a 2-node launch.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from fsdp_matrix.workload.models import save_once


def _mark(out, text):
    out.mkdir(parents=True, exist_ok=True)
    (out / "who").write_text(text)


def run(params, ctx):
    probe = params["probe"]
    t = torch.ones(2) * (ctx.rank + 1)
    dist.all_reduce(t)
    if probe == "exit_rank3" and ctx.rank == 3:
        os._exit(7)
    if probe == "hang_rank2" and ctx.rank == 2:
        while True:  # the stack dump must show this line
            time.sleep(0.05)
    if probe != "where":
        dist.all_reduce(t)  # the others go on to the next collective, as a training step would
        return {"sum": float(t.sum())}
    node = int(os.environ.get("GROUP_RANK", 0))
    # Per-node scratch: this node's local rank 0 writes, every rank of the node reads
    # through the harness's own helper, as build_4bit_model and the checkpoints write it
    mark = save_once(ctx, "written-by", lambda out: _mark(out, f"node {node}, rank {ctx.rank}"), marker="who") / "who"
    if ctx.is_main:
        (ctx.shared_dir() / "from-rank0").write_text("rank 0")
    dist.barrier()
    mine = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        "node": node,
        "scratch": str(ctx.scratch),
        "shared": str(ctx.shared_dir()),
        "scratch_holds": mark.read_text(),
        "shared_holds": (ctx.shared_dir() / "from-rank0").read_text(),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    seen = [None] * ctx.world_size
    dist.all_gather_object(seen, mine)
    return {"sum": float(t.sum()), "ranks": seen}
