"""How an exported repro script runs: this module is inlined into every script ``python -m fsdp_matrix export`` writes.

Run plainly, the script re-executes itself under ``python -m torch.distributed.run --standalone``; each rank then
initialises the process group (gloo on CPU, nccl with ``--device cuda``), runs the cell once and reports what
happened. Only the standard library is imported at module level: the launching process must not pay for importing
torch, transformers and peft a third time (it never uses them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional


def parse_args(argv: List[str], device: str, world_size: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Reproduce one fsdp-matrix cell on several ranks: the script starts "
        "itself under torchrun unless it already runs under it."
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default=device, help="cpu: gloo; cuda: nccl, one GPU per rank")
    p.add_argument("--nproc-per-node", type=int, default=world_size, help="ranks to start (default %(default)s)")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="process-group timeout in seconds: bounds a wait on a rank that failed alone",
    )
    return p.parse_args(argv)


OUTCOME_ENV = "FSDP_REPRO_OUTCOME_FILE"
"""Set by the launching process: rank 0 writes ``ok`` or ``error`` there and exits 0, and the launching process
turns it into the exit code. torchrun would otherwise follow the real traceback with its own ChildFailedError one."""


SCRATCH_ENV = "FSDP_REPRO_SCRATCH"
"""Set by the launching process: the ranks' shared scratch folder, inside a temporary folder it removes."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def relaunch(argv: List[str], device: str, world_size: int) -> int:
    """Start this script on ``--nproc-per-node`` ranks with torchrun and return its exit code."""
    args = parse_args(argv, device, world_size)
    python = [sys.executable] + (["-I"] if sys.flags.isolated else [])
    cmd = (
        python
        + [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(args.nproc_per_node),
            os.path.abspath(sys.argv[0]),
        ]
        + list(argv)
    )
    print("+ " + " ".join(cmd), flush=True)
    with tempfile.TemporaryDirectory(prefix="fsdp-repro-") as tmp:
        outcome = Path(tmp) / "outcome"
        # the ranks' scratch folder lives in here too: gone with it, however the ranks ended
        env = {**os.environ, OUTCOME_ENV: str(outcome), SCRATCH_ENV: str(Path(tmp) / "scratch")}
        code = subprocess.call(cmd, env=env)
        if code:
            return code
        return 0 if outcome.exists() and outcome.read_text() == "ok" else 1


def installed_versions(pins: Dict[str, str]) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for name in pins:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def version_report(pins: Dict[str, str]) -> str:
    """One line of installed versions, and a warning naming every package that differs from the pins."""
    found = installed_versions(pins)
    line = f"python {sys.version.split()[0]}, " + ", ".join(f"{n} {v}" for n, v in found.items())
    # a local label (+cpu, +cu121) names the build, not another release
    off = [f"{n} {found[n]} (pinned {p})" for n, p in pins.items() if (found[n] or "").split("+")[0] != p]
    return line + ("\nWARNING: not the pinned versions: " + ", ".join(off) if off else "")


def _run_once(run: Callable[[Dict[str, Any], Any], Any], params: Dict[str, Any], ctx: Any) -> Dict[str, Any]:
    import torch

    torch.manual_seed(ctx.seed)
    try:
        checks = run(dict(params), ctx) or {}
        return {"rank": ctx.rank, "status": "ok", "text": json.dumps(checks, default=str, indent=1)}
    except Exception as exc:  # the error is the observation: report it, then decide the exit code
        return {
            "rank": ctx.rank,
            "status": "error",
            "summary": f"{type(exc).__name__}: {exc}",
            "text": traceback.format_exc(),
        }


def _show(outcome: Dict[str, Any]) -> None:
    head = "ok, checks" if outcome["status"] == "ok" else "error"
    print(f"===== rank {outcome['rank']}: {head} =====\n{outcome['text'].rstrip()}", flush=True)


def rank_main(
    run: Callable[[Dict[str, Any], Any], Any],
    context_cls: type,
    params: Dict[str, Any],
    pins: Dict[str, str],
    argv: List[str],
    device: str,
    world_size: int,
) -> int:
    """One rank: run the cell, gather every rank's outcome, print them on rank 0.

    Rank 0 exits 1 when any rank raised (under the launching process it writes that to OUTCOME_ENV's file
    instead), so the script exits non-zero; the other ranks exit 0.
    """
    import torch
    import torch.distributed as dist

    args = parse_args(argv, device, world_size)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    cuda = args.device == "cuda"
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.timeout))
    # rank 0 writes shared files here (e.g. a tiny model saved for 4-bit loading); the run id is the same on all ranks
    given = os.environ.get(SCRATCH_ENV)
    if given:
        scratch = Path(given)
    else:  # started under the user's own torchrun: this node's rank 0 removes it once every rank is done
        scratch = Path(tempfile.gettempdir()) / f"fsdp-repro-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = context_cls(
        rank=rank,
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=dev,
        backend=dist.get_backend(),
        scratch=scratch,
        seed=0,
    )
    if rank == 0:
        print(version_report(pins), flush=True)
        print(f"cell params: {params}", flush=True)
    mine = _run_once(run, params, ctx)
    try:
        outcomes: List[Any] = [None] * ctx.world_size
        dist.all_gather_object(outcomes, mine)  # after it, no rank uses the scratch folder
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - another rank is gone or stuck: say what this rank saw, alone
        print(f"[rank {rank}] could not gather the other ranks' outcomes ({type(exc).__name__}: {exc})", flush=True)
        _show(mine)
        return 1 if mine["status"] != "ok" or rank == 0 else 0
    finally:
        if not given and local_rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    if rank != 0:
        return 0
    for outcome in outcomes:
        _show(outcome)
    errors = [o for o in outcomes if o["status"] != "ok"]
    verdict = (
        "; ".join(f"rank {o['rank']}: {o['summary']}" for o in errors) or "every rank trained and passed the checks"
    )
    print(f"===== outcome: {verdict}", flush=True)
    if os.environ.get(OUTCOME_ENV):
        Path(os.environ[OUTCOME_ENV]).write_text("error" if errors else "ok")
        return 0
    return 1 if errors else 0
