"""What a repro script does when run alone: ``torchrun --nproc-per-node 2 repros/<name>.py <cell options>``.

Cell options are either ``--cell ID`` (an id from matrix.yaml or a report) or one ``--<axis> VALUE`` per axis,
e.g. ``--adapter dora --dtype bf16 --orig 1 --wrap peft_policy --model llama``. Every rank runs the cell; rank 0
gathers all ranks' outcomes, prints one line, and appends the record to ``--results`` (default ``results/``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_matrix import options
from fsdp_matrix.cells import Cell, find_cell
from fsdp_matrix.expectations import Expected, expected_for
from fsdp_matrix.matrix import Matrix, load_matrix
from fsdp_matrix.records import Observed, Record


def _value(text: str) -> Any:
    return int(text) if text.lstrip("-").isdigit() else text


def parse(argv: List[str]) -> Tuple[argparse.Namespace, Dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", help="cell id, e.g. dora-bf16-orig1-peft_policy-llama-ws2")
    # declared once (fsdp_matrix/options.py): records dir, matrix, device (auto: cuda when a GPU is visible)
    options.add_arguments(p.add_argument, ("results", "matrix", "device"), defaults={"device": "auto"})
    p.add_argument("--timeout", type=float, default=180.0, help="process-group timeout: bounds a one-rank failure")
    p.add_argument("--no-record", action="store_true", help="print the outcome only")
    args, rest = p.parse_known_args(argv)
    if len(rest) % 2 or any(not k.startswith("--") for k in rest[::2]):
        p.error(f"axis options come as --name value pairs, got: {' '.join(rest)}")
    params = {k[2:].replace("-", "_"): _value(v) for k, v in zip(rest[::2], rest[1::2])}
    return args, params


def main(run: Callable[[Dict[str, Any], Any], Any], case: str, argv: List[str] = None) -> int:
    import torch
    import torch.distributed as dist

    from fsdp_matrix import records
    from fsdp_matrix.runner.session import observe
    from fsdp_matrix.runner.watching import CellRun
    from fsdp_matrix.runner.worker import init_process_group, make_context, run_cell

    args, params = parse(sys.argv[1:] if argv is None else argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    os.environ["FSDP_MATRIX_DEVICE"] = args.device
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    matrix = None
    try:
        matrix = load_matrix(args.matrix)
    except Exception as exc:  # noqa: BLE001 - a repro must still run where matrix.yaml is absent or broken
        print(f"[no expectations: {exc}]", file=sys.stderr)
    if args.cell:
        if matrix is None:
            sys.exit("--cell needs matrix.yaml; give the axes as --name value instead")
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
        gathered: List[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)  # also the point after which no rank uses the scratch folder
        duration = time.monotonic() - start
    finally:
        if ctx.local_rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    dist.destroy_process_group()
    if ctx.rank != 0:
        return 0
    status = "error" if any(r.status == "error" for r in gathered) else "ok"
    observed = observe(CellRun(key=cell.key, status=status, ranks=gathered, duration_s=duration))
    rec = _record(matrix, cell, observed, duration, f"standalone-{run_id or 'local'}")
    if not args.no_record:
        records.append(args.results, rec)
    summary = f"{rec.verdict}: {cell.key}: {rec.line}" if matrix else f"{cell.key}: {rec.line.split(' / ', 1)[1]}"
    print(summary, flush=True)
    if observed.status == "error":
        first = next(r for r in gathered if r.status == "error")
        print(first.traceback, file=sys.stderr)
    return 0


def _record(matrix: Optional[Matrix], cell: Cell, observed: Observed, duration: float, run_id: str) -> Record:
    """The cell's record, judged against matrix.yaml's rule for this env (none without a matrix)."""
    from fsdp_matrix.envs import local_versions
    from fsdp_matrix.envs.sources import env_sources
    from fsdp_matrix.verdicts import make_record

    versions = local_versions()
    expected = expected_for(matrix.case(cell.case), cell, versions) if matrix else Expected("none")
    return make_record(cell, expected, observed, versions, duration, None, run_id, env_sources(versions=versions))
