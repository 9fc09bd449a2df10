"""The launching half of an exported script, inlined before any third-party import: run plainly, the script starts
itself on the cell's ranks under torchrun, and rank 0's outcome becomes its exit code."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from typing import List

OUTCOME_ENV, SCRATCH_ENV = "FSDP_REPRO_OUTCOME_FILE", "FSDP_REPRO_SCRATCH"


def parse_args(argv: List[str], device: str, world_size: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Reproduce one fsdp-matrix cell; starts itself under torchrun.")
    p.add_argument("--device", choices=("cpu", "cuda"), default=device, help="cpu: gloo; cuda: nccl, a GPU per rank")
    p.add_argument("--nproc-per-node", type=int, default=world_size, help="ranks to start (default %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="process-group timeout (s): a rank failing alone")
    return p.parse_args(argv)


def relaunch(argv: List[str], device: str, world_size: int) -> int:
    n = parse_args(argv, device, world_size).nproc_per_node
    python = [sys.executable] + (["-I"] if sys.flags.isolated else [])
    # rank 0's outcome (torchrun would add its ChildFailedError) and the scratch folder: gone with it, however it ends
    with tempfile.TemporaryDirectory(prefix="fsdp-repro-") as tmp:
        env = {**os.environ, OUTCOME_ENV: f"{tmp}/outcome", SCRATCH_ENV: f"{tmp}/scratch"}
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", sys.argv[0], *argv]
        code = subprocess.call(python + torchrun, env=env)
        return code or int(not os.path.exists(env[OUTCOME_ENV]) or open(env[OUTCOME_ENV]).read() != "ok")
