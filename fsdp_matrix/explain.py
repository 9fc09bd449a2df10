"""``python -m fsdp_matrix explain CELL``: every rule tried for a cell, in order, and why each did or did not match.

The trials come from ``expectations.trace``, the function ``expected_for`` is derived from, so what is printed is
what a run would expect. Versions: a combo's pins (``--combo``), else the installed packages; ``--versions``
overrides single packages on top (``--versions torch=2.6.0,peft=0.14.0``). With ``--results DIR`` the newest
record of the cell (on the same device; of the same combo when one is given) is shown with its verdict.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from fsdp_matrix import options
from fsdp_matrix.cells import Cell, find_cell
from fsdp_matrix.clip import first_line
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.evidence import PLATFORM, for_rule
from fsdp_matrix.expectations import Trace, trace
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix, load_matrix
from fsdp_matrix.rules import RULE_PACKAGES
from fsdp_matrix.usage import OneLineParser

STAGES = (
    ("requires", "requires (checked first: an unmet one skips the cell)"),
    ("platform skip", "platform skips (before the case's rules)"),
    ("case rule", "case rules (first match wins)"),
    ("platform signature", "platform signatures (judge an error the case's rule did not expect: skipped)"),
)


def rule_evidence(matrix: Matrix, cell: Cell, tr: Trace) -> Optional[Tuple[str, str]]:
    """``(rule id, evidence text)`` of the rule that decides the cell, when its evidence file has a section."""
    exp = tr.expected
    if exp.platform:
        rule = f"{PLATFORM}/{exp.platform}"
    elif exp.rule is not None:
        rule = matrix.case(cell.case).rule_id(exp.rule)
    else:
        return None
    text = for_rule(matrix.evidence_dir, rule)
    return (rule, text) if text else None


def render(
    cell: Cell,
    tr: Trace,
    versions: Dict[str, Optional[str]],
    where: str,
    evidence: Optional[Tuple[str, str]] = None,
) -> List[str]:
    shown = ", ".join(f"{k} {v or '(not installed)'}" for k, v in versions.items())
    nodes = f" on {cell.nodes} nodes" if cell.nodes > 1 else ""
    lines = [
        f"cell {cell.key} (device {cell.device}, world size {cell.world_size}{nodes})",
        f"versions ({where}): {shown}",
    ]
    for stage, title in STAGES:
        trials = [t for t in tr.trials if t.stage == stage]
        lines.append(f"{title}:" + ("" if trials else " none"))
        for t in trials:
            mark = "=>" if t.decides else ("+ " if t.matched else "- ")
            lines.append(f"  {mark} {t.name}: {t.why} -> {first_line(t.outcome, 140)}")
    lines.append(f"requirement: {tr.requirement or 'none unmet'}")
    exp = tr.expected
    rule = (
        f"platform.skips({exp.platform})" if exp.platform else (f"expect[{exp.rule}]" if exp.rule is not None else None)
    )
    lines.append(f"applies: {rule or 'no rule (kind none: matrix.yaml needs one)'}: {exp.describe()}")
    if exp.source:
        lines.append(f"  source: {exp.source}")
    if evidence:
        lines.append(f"  evidence ({evidence[0]}):")
        lines += [f"    {line}".rstrip() for line in evidence[1].splitlines()]
    if tr.requirement:
        lines.append("  (the session skips the cell for the requirement; the rule is what its record expects)")
    if exp.signatures:
        lines.append(
            f"  an error it did not expect is judged skipped if it fits: {', '.join(s['id'] for s in exp.signatures)}"
        )
    return lines


def newest_record(
    results: Path, cell: Cell, combo: Optional[str], versions: Mapping[str, Optional[str]]
) -> Optional[str]:
    from fsdp_matrix.records import RECORDS_FILE, off_pins, read_all

    path = results / RECORDS_FILE if (results / RECORDS_FILE).exists() else results
    if not path.exists():
        raise MatrixError(f"--results: {results}: no such file or directory")
    recs = [r for r in read_all(path) if r.key == cell.key and r.device == cell.device and combo in (None, r.combo)]
    if not recs:
        return None
    rec = max(recs, key=lambda r: r.finished_at)
    off = off_pins(rec, versions)
    against = "the pins" if combo is not None else "the versions installed here"
    note = f"; recorded with {', '.join(off)}, not {against}" if off else ""
    return f"newest record: {rec.verdict} (combo {rec.combo}, run {rec.run_id}{note}): {rec.line}"


def main(argv: List[str]) -> int:
    p = OneLineParser(prog="fsdp_matrix explain", description=__doc__.split("\n\n")[0])
    p.add_argument("cell", help="CASE/CELL or a cell id unique across cases")
    # declared once (fsdp_matrix/options.py); the device defaults to the combo's, else cpu; versions go on top of the
    # combo's pins or the installed ones
    options.add_arguments(
        p.add_argument, ("combo", "device", "results", "matrix"), choices=options.CONCRETE_DEVICE,
        defaults={"device": None, "results": None, "matrix": DEFAULT_MATRIX}, model=options.MatrixOptions,
    )  # fmt: skip
    # checked after parsing, so that main returns its one-line error (an empty --versions adds nothing)
    options.add_arguments(p.add_argument, ("versions",), model=options.MatrixOptions, typed=False)
    args = p.parse_args(argv)
    matrix: Matrix = load_matrix(args.matrix)
    overrides = options.check("versions", args.versions) if args.versions else {}
    if args.combo is not None:  # --combo '' names no combo: an error, not the installed versions
        combo = matrix.combo(args.combo)
        versions: Dict[str, Optional[str]] = dict(combo.pins.model_dump())
        device = args.device or ("cuda" if "gpu" in combo.tags else "cpu")
        where = f"combo {combo.id}"
    else:
        versions, device, where = installed_versions(RULE_PACKAGES), args.device or "cpu", "installed here"
    if overrides:
        versions.update(overrides)
        where += ", with " + ",".join(f"{k}={v}" for k, v in overrides.items())
    cell = find_cell(matrix, args.cell, device)
    tr = trace(matrix.case(cell.case), cell, versions)
    lines = render(cell, tr, versions, where, rule_evidence(matrix, cell, tr))
    if args.results:
        lines.append(
            newest_record(args.results, cell, args.combo, versions)
            or f"newest record: none for this cell in {args.results}"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
