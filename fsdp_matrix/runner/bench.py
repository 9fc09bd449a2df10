"""``nox -s bench``: the batched runner against one torchrun launch per cell, on the same real cells.

Three ways, measured in one run, the two launch strategies interleaved (batched, per-cell, batched) so that load
on a shared machine hits both alike:
  (a) one ``torchrun`` launch per cell (what accelerate's tests do), running the repro script standalone;
  (b) this runner: every cell in as few launches as robustness allows;
  (c) the floor: the cells' own compute time (slowest rank, measured inside) plus one launch.
It prints the ratios (a)/(b) and (b)/(c). It asserts nothing about time: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from fsdp_matrix import options
from fsdp_matrix.cells import Cell, expand, unmet_requirement
from fsdp_matrix.envs import local_versions
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix, load_matrix
from fsdp_matrix.options import LaunchOptions
from fsdp_matrix.paths import writable_file
from fsdp_matrix.progress import Heartbeat
from fsdp_matrix.runner.factory import open_session


@dataclass
class Timing:
    """One way of running the cells, timed."""

    name: str
    """Which strategy."""
    wall_s: float
    """Wall time for all cells."""
    verdicts_ok: int
    """Cells whose outcome matched the expectation (both strategies must agree on real work)."""


def pick(n: int, matrix: Matrix) -> List[Cell]:
    """The first ``n`` runnable CPU cells, round-robin over (case, entry) so every kind of work is in the sample:
    each case's cells reached directly, through accelerate and through the Trainer (these cost more per cell)."""
    versions = local_versions()
    groups: dict = {}
    for case in matrix.cases:
        for c in expand(matrix, cases=[case.id]):
            if unmet_requirement(case.requires, c) is None and expected_for(case, c, versions).kind != "skip":
                groups.setdefault((case.id, c.params_dict.get("entry", "torch")), []).append(c)
    by_group = list(groups.values())
    out: List[Cell] = []
    while len(out) < n and any(by_group):
        for cells in by_group:
            if cells and len(out) < n:
                out.append(cells.pop(0))
    return out


def batched(
    cells: List[Cell], matrix: Matrix, opts: LaunchOptions, work: Path, beat: Optional[Heartbeat] = None
) -> tuple:
    session = open_session(opts.model_copy(update={"results": work}), matrix)
    launcher = session.launcher
    start = time.monotonic()
    session.prefetch(cells)
    records = []
    for cell in cells:
        records.append(session.run(cell))
        _progress(beat, f"{work.name} batched: {len(records)}/{len(cells)} cells")
    session.close()
    wall = time.monotonic() - start
    compute = sum(max((r.duration_s or 0.0) for r in rec.observed.ranks) for rec in records)
    ok = sum(rec.verdict in ("reproduced", "fix-holds", "skipped") for rec in records)
    return Timing("(b) batched", wall, ok), compute, launcher.launch_seconds


def _progress(beat: Optional[Heartbeat], status: str) -> None:
    if beat is not None:
        beat.update(status, say=True)


def per_cell(
    cells: List[Cell], matrix: Matrix, matrix_path: Path, work: Path, beat: Optional[Heartbeat] = None
) -> Timing:
    root = matrix_path.resolve().parent
    start = time.monotonic()
    ok = 0
    # what the standalone entry of a repro reads: the same options, one launch per cell
    where = options.LaunchOptions(results=work, matrix=matrix_path, device="cpu")
    for cell in cells:
        repro = root / matrix.case(cell.case).repro
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cell.world_size}"]
        cmd += [str(repro), "--cell", cell.id, *options.to_argv(where, ("results", "matrix", "device"))]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // cell.world_size))}
        _progress(beat, f"(a) one launch per cell: launching {cell.key}")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
        ok += any(line.startswith(("reproduced", "fix-holds")) for line in proc.stdout.splitlines())
        _progress(beat, f"(a) one launch per cell: {cells.index(cell) + 1}/{len(cells)} cells")
    return Timing("(a) one launch per cell", time.monotonic() - start, ok)


def _count(text: str) -> int:
    value = int(text) if text.strip().lstrip("+").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of cells, at least 1")
    return value


def main(argv: List[str] = None) -> int:
    p = options.Parser(prog="fsdp_matrix bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=_count, default=30, help="how many cells to time (default: 30)")
    p.add_argument("--json", type=Path, default=None, help="write the timings here as JSON")
    # the cells are the matrix's CPU cells at world size 2, so only these launch options apply
    options.add_arguments(p.add_argument, ("matrix", "cell_timeout", "torchrun_args"))
    args = p.parse_args(argv)
    try:
        opts = options.from_namespace(args, ("matrix", "cell_timeout", "torchrun_args"))
    except options.OptionError as exc:
        p.error(str(exc))
    if args.json:
        writable_file(args.json)  # before the runs: a --json that cannot be written must not cost them first
    opts = opts.model_copy(update={"matrix": opts.matrix or DEFAULT_MATRIX, "device": "cpu", "world_size": 2})
    args.matrix = opts.matrix
    matrix = load_matrix(args.matrix)
    cells = pick(args.cells, matrix)
    with tempfile.TemporaryDirectory(prefix="fsdp-bench-") as tmp, Heartbeat("bench", "starting") as beat:
        work = Path(tmp)
        _progress(beat, f"step 1/3: (b) batched, run 1, {len(cells)} cells")
        b1, compute1, launches1 = batched(cells, matrix, opts, work / "b1", beat)
        _progress(beat, f"step 2/3: (a) one torchrun launch per cell, {len(cells)} launches")
        a = per_cell(cells, matrix, args.matrix, work / "a", beat)
        _progress(beat, f"step 3/3: (b) batched, run 2, {len(cells)} cells")
        b2, compute2, launches2 = batched(cells, matrix, opts, work / "b2", beat)
    b_wall = (b1.wall_s + b2.wall_s) / 2
    floor = (compute1 + compute2) / 2 + min(launches1 + launches2)
    rows = [
        (a.name, a.wall_s, a.verdicts_ok),
        ("(b) batched, run 1", b1.wall_s, b1.verdicts_ok),
        ("(b) batched, run 2", b2.wall_s, b2.verdicts_ok),
        ("(c) compute + one launch", floor, None),
    ]
    print(f"{len(cells)} cells, world size 2, {os.cpu_count()} cores")
    for name, wall, ok in rows:
        print(f"  {name:28} {wall:8.1f} s" + (f"   {ok}/{len(cells)} as expected" if ok is not None else ""))
    print(
        f"  launches (b): {len(launches1)} + {len(launches2)}, startup {min(launches1 + launches2):.1f} s each at best"
    )
    print(f"(a)/(b) = {a.wall_s / b_wall:.1f}x   (b)/(c) = {b_wall / floor:.1f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cells": len(cells),
                    "a_s": a.wall_s,
                    "b_s": [b1.wall_s, b2.wall_s],
                    "c_s": floor,
                    "a_over_b": a.wall_s / b_wall,
                    "b_over_c": b_wall / floor,
                }
            )
        )
    return 0 if a.verdicts_ok == b1.verdicts_ok == b2.verdicts_ok == len(cells) else 1
