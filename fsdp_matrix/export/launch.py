"""The launching half of an exported script, inlined before any third-party import: run plainly, the script starts
itself on the cell's ranks under torchrun, and rank 0's outcome becomes its exit code."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
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
    cmd = [sys.executable] + (["-I"] if sys.flags.isolated else []) + ["-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={n}", sys.argv[0], *argv]
    # rank 0 writes its outcome here (torchrun would follow a rank's traceback with its own ChildFailedError), and
    # the ranks' scratch folder lives here too: both gone with it, however the ranks ended
    with tempfile.TemporaryDirectory(prefix="fsdp-repro-") as tmp:
        outcome = Path(tmp, "outcome")
        code = subprocess.call(cmd, env={**os.environ, OUTCOME_ENV: str(outcome), SCRATCH_ENV: f"{tmp}/scratch"})
        return code or int(not outcome.exists() or outcome.read_text() != "ok")
