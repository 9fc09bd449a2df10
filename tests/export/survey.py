"""Export one cell of every case, count its lines before and after, run it alone and compare its verdict.

    python tests/export/survey.py [--before /path/to/other/checkout] [--cases a,b] [--out DIR] [--no-run]

The cell of a case is its first one that matrix.yaml expects to reproduce the report with the installed versions,
else its first expected to train, else its first. "before" is the line count of the same export made by another
checkout (e.g. main), with its own code. Prints a markdown table; exits 1 when a verdict differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fsdp_matrix.cells import unmet_requirement
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.export.cli import trace_for
from fsdp_matrix.export.prune import Trace
from fsdp_matrix.export.script import full_script, prepare, render_script
from fsdp_matrix.export.verify import installed_versions, matching_combo_id, pick_cell, run_alone
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.verdicts import Verdict

MATRIX = load_matrix()


def cached_trace(exp, folder):
    """The cell's trace: from ``folder`` when it was taken of the same full script, else a new traced run."""
    path = folder / f"{exp.stem}.json" if folder else None
    if path is not None and path.exists():
        data = json.loads(path.read_text())
        script = full_script(exp, checks=data.get("checks", True))
        # the lines up to the end of the inlined body decide what a trace's line numbers mean (the rank side after
        # them may change)
        if data["full"].splitlines()[: script.body[1]] == script.text.splitlines()[: script.body[1]]:
            return Trace(set(data["lines"]), data["raised"], data["outcome"], data.get("checks", True))
    trace = trace_for(exp, "auto", sys.executable)
    if trace is not None and path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        full = full_script(exp, checks=trace.checks).text
        data = {"full": full, "lines": sorted(trace.lines), "raised": trace.raised, "outcome": trace.outcome}
        path.write_text(json.dumps({**data, "checks": trace.checks}))
    return trace


def before_lines(checkout: Path, ref: str, combo: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "fsdp_matrix", "export", ref, "--combo", combo, "--out", tmp]
        cmd += ["--results", str(Path(tmp, "none"))]
        subprocess.run(cmd, cwd=checkout, check=True, capture_output=True, env={"PYTHONPATH": str(checkout)})
        return len(next(Path(tmp).glob("*.py")).read_text().splitlines())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, help="another checkout whose export gives the 'before' line counts")
    p.add_argument("--cases", help="comma-separated case ids (default: all)")
    p.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="fsdp-export-survey-")))
    p.add_argument("--no-run", action="store_true", help="count lines only")
    p.add_argument("--traces", type=Path, help="keep each cell's trace here, and reuse it while the script is the same")
    args = p.parse_args()
    versions = installed_versions(MATRIX)
    combo = matching_combo_id(MATRIX, versions) or MATRIX.newest("cpu").id
    wanted = set(args.cases.split(",")) if args.cases else None
    cases = [c for c in MATRIX.cases if wanted is None or c.id in wanted]
    print(f"combo {combo}; scripts in {args.out}", flush=True)
    print("| case | cell | expected | before | after | verdict alone |\n| --- | --- | --- | ---: | ---: | --- |")
    bad = 0
    for i, case in enumerate(cases, 1):
        start = time.monotonic()
        cell = pick_cell(case, versions)
        ref = f"{case.id}/{cell.id}"
        exp = prepare(MATRIX, ref, combo, Path("/nonexistent"), DEFAULT_MATRIX.parent)
        expected = expected_for(case, cell, versions)
        folder = args.out / case.id
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / f"{exp.stem}.py"
        script.write_text(render_script(exp, cached_trace(exp, args.traces)))
        after = len(script.read_text().splitlines())
        before = before_lines(args.before, ref, combo) if args.before else "-"
        verdict = "-"
        unmet = unmet_requirement(case.requires, cell)
        if unmet:
            verdict = f"skipped in the matrix too ({unmet.split(':')[0]})"
        elif not args.no_run and expected.kind in ("error", "ok"):
            alone = run_alone(script)
            got = alone.judge(expected).verdict
            want = Verdict.REPRODUCED if expected.kind == "error" else Verdict.FIX_HOLDS
            verdict = got.value if got == want else f"{got.value} (matrix: {want.value})"
            bad += got != want
        elif expected.kind not in ("error", "ok"):
            verdict = f"not run ({expected.describe()})"
        print(f"| {case.id} | {cell.id} | {expected.kind} | {before} | {after} | {verdict} |", flush=True)
        print(f"[survey] {i}/{len(cases)} {case.id} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
