"""What a repro script does when run alone: ``torchrun --nproc-per-node 2 repros/<name>.py <cell options>``.

Cell options are either ``--cell ID`` (an id from matrix.yaml or a report) or one ``--<axis> VALUE`` per axis,
e.g. ``--adapter dora --dtype bf16 --orig 1 --wrap peft_policy --model llama``. Every rank runs the cell and prints
its own exception at once; rank 0 gathers all ranks' outcomes (through the launch's store, waiting at most
``--gather-timeout`` for a rank still in a collective), prints one line, and appends the record to ``--results``
(default ``results/``). A case not yet in matrix.yaml runs too, without an expectation (the README's step 1).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_matrix import options
from fsdp_matrix.cells import Cell, find_cell
from fsdp_matrix.expectations import Expected, expected_for
from fsdp_matrix.matrix import Matrix, load_matrix
from fsdp_matrix.records import Observed, RankResult, Record


def _value(text: str) -> Any:
    return int(text) if text.lstrip("-").isdigit() else text


def parse(argv: List[str]) -> Tuple[argparse.Namespace, Dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", help="cell id, e.g. dora-bf16-orig1-peft_policy-llama-ws2")
    # declared once (fsdp_matrix/options.py): records dir, matrix, device (auto: cuda when a GPU is visible)
    options.add_arguments(p.add_argument, ("results", "matrix", "device"), defaults={"device": "auto"})
    p.add_argument("--timeout", type=float, default=180.0, help="process-group timeout: bounds a one-rank failure")
    p.add_argument("--no-record", action="store_true", help="print the outcome only")
    p.add_argument(
        "--gather-timeout",
        type=float,
        default=30.0,
        help="seconds rank 0 waits for the other ranks' outcomes after its own (a rank still in a collective is hung)",
    )
    args, rest = p.parse_known_args(argv)
    if len(rest) % 2 or any(not k.startswith("--") for k in rest[::2]):
        p.error(f"axis options come as --name value pairs, got: {' '.join(rest)}")
    params = {k[2:].replace("-", "_"): _value(v) for k, v in zip(rest[::2], rest[1::2])}
    return args, params


def main(run: Callable[[Dict[str, Any], Any], Any], case: str, argv: List[str] = None) -> int:
    import torch
    import torch.distributed as dist

    from fsdp_matrix.runner.worker import init_process_group, make_context, run_cell

    args, params = parse(sys.argv[1:] if argv is None else argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    os.environ["FSDP_MATRIX_DEVICE"] = args.device
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    matrix = _matrix(args.matrix, case)
    if args.cell:
        if matrix is None:
            sys.exit(f"--cell needs case {case} in matrix.yaml; give the axes as --name value instead")
        cell = find_cell(matrix, f"{case}/{args.cell}", args.device, world_size)
    else:
        cell = Cell(case, tuple(sorted(params.items())), args.device, world_size)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        # every rank of this node must find the same folder (rank 0 may save a tiny model there for the others)
        scratch = Path(tempfile.gettempdir()) / f"fsdp-matrix-{run_id}"
        scratch.mkdir(exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="fsdp-matrix-"))
    ctx = make_context(scratch)  # one machine: its scratch is every rank's (RankContext.shared_dir)
    try:
        init_process_group(ctx, args.timeout)
        start = time.monotonic()
        mine = run_cell(run, cell.params_dict, ctx, ctx.rank)
        if mine.status == "error":  # at once, on its own rank: a peer stuck in a collective cannot hide it
            print(f"rank {ctx.rank}: {mine.traceback}", file=sys.stderr, flush=True)
        gathered = _gather(mine, ctx.rank, world_size, args.gather_timeout)
        duration = time.monotonic() - start
    finally:
        if ctx.local_rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    if ctx.rank != 0:
        dist.destroy_process_group()
        return 0
    missing = [r.rank for r in gathered if r.status == "hang"]
    _report(args, matrix, cell, gathered, duration, run_id)
    if missing:  # a rank still stuck in a collective: exit non-zero, so that torchrun stops it now
        return 1
    dist.destroy_process_group()
    return 0


def _matrix(path: Optional[Path], case: str) -> Optional[Matrix]:
    """matrix.yaml, or None where it is absent, broken or does not have ``case`` yet (a repro is checked alone
    before its entry is written: the README's step 1 comes before step 2)."""
    try:
        matrix = load_matrix(path)
    except Exception as exc:  # noqa: BLE001 - a repro must still run where matrix.yaml is absent or broken
        print(f"[no expectations: {exc}]", file=sys.stderr)
        return None
    if all(c.id != case for c in matrix.cases):
        if os.environ.get("RANK", "0") == "0":
            print(f"[no expectations: case {case} is not in matrix.yaml yet]", file=sys.stderr)
        return None
    return matrix


def _gather(mine: RankResult, rank: int, world_size: int, timeout_s: float) -> List[RankResult]:
    """Every rank's outcome on rank 0 (the others get []), through the launch's key-value store rather than a
    collective: a rank left waiting in a collective its peer never entered (a misaligned collective) would make
    ``all_gather_object`` wait for the whole process-group timeout. A rank that gives no outcome within
    ``timeout_s`` is reported as hung."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    store.set(f"fsdp-matrix/outcome/{rank}", pickle.dumps(mine))
    if rank != 0:
        return []
    out = []
    for r in range(world_size):
        key = f"fsdp-matrix/outcome/{r}"
        try:
            store.wait([key], timedelta(seconds=timeout_s))
            out.append(pickle.loads(store.get(key)))
        except Exception:  # noqa: BLE001 - DistStoreError/RuntimeError by release: the rank is still busy
            note = f"rank {r} gave no outcome within {timeout_s:g} s of rank 0's (stuck in a collective?)"
            out.append(RankResult(rank=r, status="hang", error_type="NoOutcome", error_message=note))
    return out


def _report(args: argparse.Namespace, matrix, cell: Cell, gathered: List[RankResult], duration: float, run_id):
    """Rank 0: judge the gathered outcomes, append the record, print one line."""
    from fsdp_matrix import records
    from fsdp_matrix.runner.session import observe
    from fsdp_matrix.runner.watching import CellRun

    statuses = {r.status for r in gathered}
    status = "error" if "error" in statuses else ("hang" if "hang" in statuses else "ok")
    observed = observe(CellRun(key=cell.key, status=status, ranks=gathered, duration_s=duration))
    rec = _record(matrix, cell, observed, duration, f"standalone-{run_id or 'local'}")
    if not args.no_record:
        records.append(args.results, rec)
    summary = f"{rec.verdict}: {cell.key}: {rec.line}" if matrix else f"{cell.key}: {rec.line.split(' / ', 1)[1]}"
    print(summary, flush=True)


def _record(matrix: Optional[Matrix], cell: Cell, observed: Observed, duration: float, run_id: str) -> Record:
    """The cell's record, judged against matrix.yaml's rule for this env (none without a matrix)."""
    from fsdp_matrix.envs import local_versions
    from fsdp_matrix.envs.sources import env_sources
    from fsdp_matrix.verdicts import make_record

    versions = local_versions()
    expected = expected_for(matrix.case(cell.case), cell, versions) if matrix else Expected("none")
    return make_record(cell, expected, observed, versions, duration, None, run_id, env_sources(versions=versions))
