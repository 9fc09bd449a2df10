"""``python -m fsdp_matrix triage [FILE|-] [--results DIR] [--versions torch=2.4.1,peft=0.13.2]``.

Reads a traceback or log a user pasted and says which known PEFT x FSDP failures it is: the matching cases with
their upstream links, the versions where each reproduces and where it is fixed, and the workarounds expected or
observed to hold on the user's versions (or the nearest combo). matrix.yaml alone is enough; the records of a
results dir add what was observed.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from packaging.version import InvalidVersion, Version

from fsdp_matrix.errors import MatrixError
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import PACKAGES, Combo, Matrix, load_matrix, same_value
from fsdp_matrix.records import Record, Skipped, iter_records, latest
from fsdp_matrix.runner import options
from fsdp_matrix.triage.match import (
    CaseMatch,
    Hit,
    in_range,
    match,
    nearest_combo,
    platform_hits,
    reproducing_cells,
    rule_versions,
    workarounds,
)
from fsdp_matrix.triage.parse import Paste, parse
from fsdp_matrix.usage import OneLineParser
from fsdp_matrix.verdicts import Verdict

EXAMPLES = 3
"""Cell ids shown per workaround."""
DETAILED = 3
"""Cases shown in full; the rest (weaker fits, or a generic error many cases meet) get one line each."""


class TriageError(MatrixError):
    """The paste or an option cannot be read."""


def _read(source: Optional[str]) -> str:
    if source in (None, "-"):
        return sys.stdin.read()
    try:
        return Path(source).read_text(errors="replace")
    except OSError as exc:
        raise TriageError(f"{source}: cannot read: {exc.strerror or exc}") from None


def _versions_line(versions: Mapping[str, Optional[str]]) -> str:
    return ", ".join(f"{p} {v}" for p, v in versions.items() if v) or "none known"


def _when(rule) -> str:
    when = getattr(rule, "when", None) or {}
    return ", ".join(f"{k}={v}" for k, v in when.items()) or "every cell"


def _compatible(a: Mapping, b: Mapping) -> bool:
    """Two ``when`` can hold for one cell: every key they share has a value in common."""
    for key in set(a) & set(b):
        left = a[key] if isinstance(a[key], list) else [a[key]]
        right = b[key] if isinstance(b[key], list) else [b[key]]
        if not any(same_value(x, y) for x in left for y in right):
            return False
    return True


def _signature_text(hit: Hit) -> str:
    err = hit.signature.error
    where = f" in {err.module}" if getattr(err, "module", None) else ""
    return f"{err.type}: /{err.match}/{where}"


def _observed(records: List[Record], verdict: str) -> str:
    by_combo: Dict[str, set] = defaultdict(set)
    versions: Dict[str, str] = {}
    for rec in records:
        if rec.verdict == verdict:
            key = rec.combo or "(no combo)"
            by_combo[key].add(rec.cell)
            versions[key] = _versions_line({p: rec.versions.get(p) for p in PACKAGES})
    return "; ".join(f"{c} ({versions[c]}): {len(cells)} cells" for c, cells in sorted(by_combo.items()))


def _fixes(found: CaseMatch, hit: Hit) -> List[str]:
    """The case's ``ok`` rules from some release on for the same cells (no narrower ``when``): where it is fixed."""
    when = getattr(hit.signature.rule, "when", None) or {}
    out = []
    for i, rule in enumerate(found.case.expect):
        if rule.ok and rule.versions and set(rule.when) <= set(when) and _compatible(rule.when, when):
            out.append(f"{rule_versions(rule)} (expect[{i}], {_when(rule)}: {rule.source})")
    return out


def _observed_for_rule(found: CaseMatch, hit: Hit, records: List[Record]) -> List[str]:
    """What the records say about this rule: the combos where it held (reproduced), and the combos where the same
    cells trained instead (fix-holds): the observed versions where it reproduces and where it is fixed."""
    err = hit.signature.error
    mine = [r for r in records if r.case == found.case.id]
    # by the signature the record expected, not by the rule's index: indexes move whenever matrix.yaml gains a rule,
    # and records outlive the matrix they were judged with
    held = [
        r
        for r in mine
        if r.verdict == Verdict.REPRODUCED.value
        and r.expected.get("match") == err.match
        and r.expected.get("error_type") == err.type
    ]
    cells = {r.cell for r in held}
    out = []
    if held:
        out.append(f"      observed reproduced (records): {_observed(held, Verdict.REPRODUCED.value)}")
        fixed = _observed([r for r in mine if r.cell in cells], Verdict.FIX_HOLDS.value)
        out.append(f"      observed fixed, same cells (records): {fixed or 'none in these records'}")
    return out


def _case_report(
    matrix: Matrix,
    found: CaseMatch,
    paste: Paste,
    versions: Mapping[str, Optional[str]],
    near: Optional[Combo],
    records: List[Record],
) -> List[str]:
    case = found.case
    lines = [f"{case.id}: {case.title}", f"   upstream: {case.report}"]
    for hit in found.hits[:3]:
        rule = hit.signature.rule
        lines.append(f"   fits {hit.signature.where} ({_when(rule)}): {_signature_text(hit)}")
        lines.append(f"      source: {rule.source}")
        lines += [f"      note: {note}" for note in hit.notes]
        mine = in_range(rule, versions)
        state = {True: "yours are in range", False: "yours are not", None: "yours are unknown"}[mine]
        lines.append(f"      reproduces (rule): {rule_versions(rule)}; {state}")
        fixes = _fixes(found, hit)
        lines.append(f"      fixed (rules): {'; '.join(fixes) if fixes else 'no release fixes it in matrix.yaml'}")
        lines += _observed_for_rule(found, hit, records)
    # records with this error that no rule expected (DIFFERENT-ERROR, REGRESSION): reproduced ones are shown above
    unexpected = [r for r in found.records if r.verdict != Verdict.REPRODUCED.value]
    for verdict in sorted({r.verdict for r in unexpected}):
        lines.append(f"   observed with this error, verdict {verdict} (records): {_observed(unexpected, verdict)}")
    repro = {c.id for c in reproducing_cells(case, paste, versions)}
    if repro:
        lines.append(f"   cells expected to raise it on your versions: {len(repro)}, e.g. {sorted(repro)[0]}")
    cpu = [c for c in matrix.combos if "cpu" in c.tags]
    lines += _workaround_lines(case, versions, near, records, cpu)
    return lines


def _workaround_lines(case, versions, near: Optional[Combo], records: List[Record], combos: List[Combo]) -> List[str]:
    mine = workarounds(case, versions)
    label = "your versions"
    if not mine and near is not None:
        mine, label = workarounds(case, near.pins.model_dump()), f"the nearest combo {near.id}"
    if not mine:
        elsewhere = [
            f"{c.id} ({sum(map(len, found.values()))} cells)"
            for c in combos
            if (found := workarounds(case, c.pins.model_dump()))
        ]
        where = f"; expected to train on: {', '.join(elsewhere)}" if elsewhere else ""
        return [f"   workarounds: no cell of this case is expected to train on your versions{where}"]
    where, observed = _observed_here(case.id, versions, near, records)
    lines = [f"   workarounds expected to hold on {label} (cells of this case expected ok):"]
    for index, cells in sorted(mine.items(), key=lambda kv: -len(kv[1])):
        rule = case.expect[index]
        ids = sorted(c.id for c in cells)
        lines.append(f"    - expect[{index}] {_when(rule)}: {len(ids)} cell(s), e.g. {', '.join(ids[:EXAMPLES])}")
        lines.append(f"      source: {rule.source}")
        seen = [observed[i] for i in ids if i in observed]
        if seen:
            held = sum(r.verdict == Verdict.FIX_HOLDS.value for r in seen)
            lines.append(f"      observed {where}: fix-holds {held}/{len(seen)} (records)")
    return lines


def _same_release(mine: Optional[str], theirs: Optional[str]) -> bool:
    try:
        return Version(mine).public == Version(theirs).public
    except (InvalidVersion, TypeError):
        return False


def _observed_here(
    case_id: str, versions: Mapping[str, Optional[str]], near: Optional[Combo], records: List[Record]
) -> Tuple[str, Dict[str, Record]]:
    """The case's records run on the user's versions (every version they gave equal), else on the nearest combo."""
    mine = [r for r in records if r.case == case_id]
    known = {p: v for p, v in versions.items() if v}
    same = [r for r in mine if known and all(_same_release(v, r.versions.get(p)) for p, v in known.items())]
    if same:
        return "on your versions", {r.cell: r for r in same}
    if near is None:
        return "", {}
    return f"on combo {near.id}", {r.cell: r for r in mine if r.combo == near.id}


def render(
    matrix: Matrix,
    paste: Paste,
    versions: Mapping[str, Optional[str]],
    versions_from: str,
    records: List[Record],
) -> Tuple[str, int]:
    """The whole answer as text, and how many cases and platform rules matched."""
    lines = []
    for err in paste.errors[:3]:
        lines.append(f"pasted error: {err.type}: {err.message[:300]}")
    if not paste.errors:
        lines.append("pasted error: no exception line found; matching the message text alone")
    raised = next((f.module for f in reversed(paste.frames) if f.module), None)
    if raised:
        lines.append(f"innermost pasted frame in a known package: {raised}")
    near = nearest_combo(matrix, versions)
    lines.append(f"versions ({versions_from}): {_versions_line(versions)}")
    if near is not None:
        lines.append(f"nearest combo: {near.id} ({_versions_line(near.pins.model_dump())})")
    found = match(matrix, paste, records)
    platform = platform_hits(matrix, paste)
    lines.append("")
    if not found and platform:
        lines.append("No case matches this error; it fits a platform rule (a fact about a release, below).")
    elif not found:
        lines.append("No known case matches this error: no rule's signature and no observed record fits it.")
        lines.append(
            "If it is a PEFT x FSDP failure, write a case for it (README 'Adding a case'), or start from the "
            "nearest cell's standalone repro: python -m fsdp_matrix export CELL"
        )
    best = found[0].score if found else 0.0
    for n, item in enumerate(found, 1):
        if n > DETAILED or item.score < best - 1:
            hit = item.hits[0] if item.hits else None
            via = f"{hit.signature.where}, {_when(hit.signature.rule)}" if hit else "observed records"
            lines.append(f"{n}. also fits {item.case.id} ({via}): {item.case.report}")
            continue
        body = _case_report(matrix, item, paste, versions, near, records)
        lines.append(f"{n}. {body[0]}")
        lines += body[1:]
        lines.append("")
    for hit in platform:
        rule = hit.signature.rule
        reason = getattr(rule, "skip", None) or getattr(rule, "reason", None) or ""
        lines.append(f"platform {hit.signature.where} ({rule_versions(rule)}): {reason}")
        lines.append(f"   source: {getattr(rule, 'source', '')}")
    return "\n".join(lines).rstrip() + "\n", len(found) + len(platform)


def load_records(results: Optional[Path]) -> Tuple[List[Record], List[Skipped]]:
    """The newest record per combo and cell under ``results`` (none without it), and the lines that were not."""
    if results is None:
        return [], []
    if not results.exists():
        raise TriageError(f"--results: {results}: no such file or directory")
    skipped: List[Skipped] = []
    return list(latest(iter_records(results, skipped)).values()), skipped


def main(argv: Optional[List[str]] = None) -> int:
    p = OneLineParser(
        prog="fsdp_matrix triage", description="Match a pasted traceback or log against the matrix's known failures."
    )
    p.add_argument("file", nargs="?", help="the traceback or log; '-' or nothing reads stdin")
    # declared once (runner/options.py); the versions are the user's (default: the installed ones)
    options.add_arguments(
        p.add_argument, ("results", "matrix"), defaults={"results": None}, model=options.MatrixOptions
    )
    # checked after parsing, so that main returns its one-line error
    options.add_arguments(p.add_argument, ("versions",), model=options.MatrixOptions, typed=False)
    args = p.parse_args(argv)
    if args.versions is not None:
        versions, versions_from = dict(options.check("versions", args.versions)), "given with --versions"
    else:
        versions, versions_from = installed_versions(PACKAGES), "installed here"
    matrix = load_matrix(args.matrix, check_repros=False)
    records, skipped = load_records(args.results)
    paste = parse(_read(args.file))
    if not paste.text:
        raise TriageError("the paste is empty: give a file, or pipe the traceback into stdin")
    text, matched = render(matrix, paste, versions, versions_from, records)
    if args.results is not None:
        lost = f", {len(skipped)} lines skipped (not records; first: {skipped[0]})" if skipped else ""
        print(f"records: {len(records)} read from {args.results}{lost}")
    sys.stdout.write(text)
    return 0 if matched else 1
