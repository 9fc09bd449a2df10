"""``python -m fsdp_matrix triage [FILE|-] [--results DIR] [--versions torch=2.4.1,peft=0.13.2] [--json]``.

Reads a traceback or log a user pasted and says which known PEFT x FSDP failures it is, with the evidence for each
claim (strong, likely, weak): the cases with their upstream links, the versions where the matched rule reproduces and
where it stops, and the changes of the matched rule's settings expected or observed to train on the user's versions
(or the nearest combo). A paste whose evidence points elsewhere (DeepSpeed ZeRO-3, a config typo...) is not claimed.
matrix.yaml alone is enough; the records of a results dir add what was observed. ``--json`` prints the same answer
as a JSON object (``fsdp_matrix.triage.answer.Answer``).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from packaging.version import InvalidVersion, Version

from fsdp_matrix import options, patterns
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import PACKAGES, Matrix, load_matrix, same_value
from fsdp_matrix.records import Record, Skipped, iter_records, latest
from fsdp_matrix.rules import RULE_PACKAGES
from fsdp_matrix.triage.answer import Answer, Claim, PlatformFit, RuleFit, Similar, Workaround
from fsdp_matrix.triage.match import (
    CaseMatch,
    Hit,
    claims,
    distance,
    in_range,
    match,
    nearest_combo,
    platform_hits,
    reproducing_cells,
    rule_versions,
)
from fsdp_matrix.triage.parse import MAX_BYTES, MAX_ERRORS, Paste, decode, parse
from fsdp_matrix.triage.stated import stated_versions
from fsdp_matrix.triage.versions import (
    fails_on,
    fixed_in,
    lacking_options,
    observed_range,
    older_than_observed,
    workarounds,
)
from fsdp_matrix.triage.works import what_works, with_settings
from fsdp_matrix.usage import OneLineParser
from fsdp_matrix.verdicts import Verdict

EXAMPLES = 3
"""Cell ids shown per workaround."""
DETAILED = 3
"""Cases shown in full; the rest (weaker fits, or a generic error many cases meet) get one line each."""


class TriageError(MatrixError):
    """The paste or an option cannot be read."""


MAX_READ = 64 * 1024 * 1024
"""How much of a paste is read at most (``/dev/zero`` never ends): its head and tail are kept of that much."""


def _bounded_read(stream, limit: int = MAX_BYTES):
    """The stream's first and last ``limit / 2`` characters (or bytes), read in chunks: a traceback's start and its
    exception line, without holding a whole log of many ranks in memory; and whether it was cut at ``MAX_READ``."""
    half = limit // 2
    head = stream.read(half)
    tail = head[:0]
    taken = len(head)
    while True:
        chunk = stream.read(half)
        if not chunk:
            return head + tail, False
        tail = (tail + chunk)[-half:]
        taken += len(chunk)
        if taken >= MAX_READ:
            return head + tail, True


_CUT = f"the paste is larger than {MAX_READ >> 20} MiB"


def _head_and_tail(stream, limit: int = MAX_BYTES):
    """``_bounded_read``'s text; a paste cut at ``MAX_READ`` is said in one line."""
    text, cut = _bounded_read(stream, limit)
    if cut:
        print(f"triage: {_CUT}: read its first {MAX_READ >> 20} MiB only", file=sys.stderr)
    return text


def _read(source: Optional[str]) -> str:
    """The paste, at most ``MAX_BYTES`` of it: its head and its tail."""
    return _read_paste(source)[0]


def _read_paste(source: Optional[str]) -> Tuple[str, bool]:
    """The paste, at most ``MAX_BYTES`` of it (its head and its tail), and whether it was cut at ``MAX_READ``."""
    if source in (None, "-"):
        stdin = getattr(sys.stdin, "buffer", None)  # bytes, so that a UTF-16 paste is decoded by its BOM
        data, cut = _bounded_read(stdin if stdin else sys.stdin)
        return (decode(data) if stdin else data), cut
    try:
        with open(source, "rb") as fh:
            data, cut = _bounded_read(fh)
            return decode(data), cut
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


def _same_release(mine: Optional[str], theirs: Optional[str]) -> bool:
    try:
        return Version(mine).public == Version(theirs).public
    except (InvalidVersion, TypeError):
        return False


def _observed_here(
    case_id: str, versions: Mapping[str, Optional[str]], near, records: List[Record]
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


def _rule_fit(matrix: Matrix, found: CaseMatch, hit: Hit, versions, records: List[Record], older: bool) -> RuleFit:
    rule = hit.signature.rule
    unknown = ["your versions are older than every combo observed: whether it reproduces there is not known"]
    index = int(hit.signature.where.split("[", 1)[1].rstrip("]"))
    fixed = fixed_in(matrix, found.case, index)
    return RuleFit(
        rule=hit.signature.where,
        when=_when(rule),
        signature=_signature_text(hit),
        source=getattr(rule, "source", "") or "",
        level=hit.level,
        evidence=hit.evidence,
        notes=hit.notes + ([hit.against] if hit.against else []) + (unknown if older else []),
        reproduces=rule_versions(rule),
        in_range=None if older else in_range(rule, versions),
        fixed=fixed.text,
        fixed_versions=fixed.versions,
        observed=_observed_for_rule(found, hit, records),
    )


def _workarounds(matrix: Matrix, found: CaseMatch, versions, near, records, outside: List[str]):
    """(label, workarounds, note) for the claimed case's matched rule."""
    if older_than_observed(outside):
        return "", [], "none offered: " + "; ".join(line for line in outside if "older than every combo" in line)
    hit = found.hits[0] if found.hits else None
    if hit is None:
        return "", [], "no rule of this case fits the paste (only records do)"
    index = int(hit.signature.where.split("[", 1)[1].rstrip("]"))
    mine, label, on = workarounds(matrix, found.case, index, versions), "your versions", versions
    if not mine and near is not None and not any(versions.values()):
        on = near.pins.model_dump()
        mine, label = workarounds(matrix, found.case, index, on), f"the nearest combo {near.id}"
    if not mine:
        return "", [], f"no change of one of {hit.signature.where}'s settings is expected to train on these versions"
    where, observed = _observed_here(found.case.id, versions, near, records)
    out = []
    for w in mine:
        rule = found.case.expect[w.rule]
        seen = [observed[i] for i in w.cells if i in observed]
        held = sum(r.verdict == Verdict.FIX_HOLDS.value for r in seen)
        out.append(
            Workaround(
                change=w.change,
                together=w.together,
                rule=f"expect[{w.rule}]",
                when=_when(rule),
                cells=len(w.cells),
                examples=w.cells[:EXAMPLES],
                source=getattr(rule, "source", "") or "",
                observed=f"observed {where}: fix-holds {held}/{len(seen)} (records)" if seen else None,
            )
        )
    return label, out, None


def _nearest_works(matrix: Matrix, found: CaseMatch, near, versions) -> List[str]:
    """Settings that train on the nearest combo that has one, when nothing is offered on the user's versions (older
    or newer than every combo observed): said as that combo's, not as the user's. A setting the user's own release
    lacks (a platform skip: no ``autocast_adapter_dtype`` before PEFT 0.12) is never offered; combos as near as the
    nearest are tried in matrix order, so that one lacking the setting does not hide the next."""
    if near is None or not found.hits:
        return []
    index = int(found.hits[0].signature.where.split("[", 1)[1].rstrip("]"))
    lacking = lacking_options(matrix, versions)
    tagged = [c for c in matrix.combos if "cpu" in c.tags] or list(matrix.combos)
    for combo in [near] + sorted((c for c in tagged if c is not near), key=lambda c: distance(versions, c)):
        mine = [
            w
            for w in workarounds(matrix, found.case, index, combo.pins.model_dump())
            if w.key not in lacking and not fails_on(found.case, w.cells, versions)
        ]
        if mine:
            return [
                f"set {with_settings(w.change, w.together)} (trains on the nearest combo with a setting that does, "
                f"{combo.id}; not known on yours)"
                for w in mine
            ]
    return []


def _claim(matrix: Matrix, found: CaseMatch, paste: Paste, versions, near, records, outside) -> Claim:
    case = found.case
    unexpected = [r for r in found.records if r.verdict != Verdict.REPRODUCED.value]
    observed = [
        f"observed with this error, verdict {verdict} (records): {_observed(unexpected, verdict)}"
        for verdict in sorted({r.verdict for r in unexpected})
    ]
    older = older_than_observed(outside)
    repro = [] if older else sorted({c.id for c in reproducing_cells(case, paste, versions)})
    label, offered, note = _workarounds(matrix, found, versions, near, records, outside)
    fits = [_rule_fit(matrix, found, hit, versions, records, older) for hit in found.hits[:3]]
    return Claim(
        case=case.id,
        title=case.title,
        report=case.report,
        level=found.level,
        fits=fits,
        observed=observed,
        reproducing_cells=len(repro),
        example_cell=repro[0] if repro else None,
        workarounds_on=label,
        workarounds=offered,
        workarounds_note=note,
        what_works=what_works(offered, label, fits[0] if fits else None, versions)
        or _nearest_works(matrix, found, near, versions),
    )


def build(
    matrix: Matrix,
    paste: Paste,
    versions: Mapping[str, Optional[str]],
    versions_from: str,
    records: List[Record],
) -> Answer:
    """The whole answer for one paste."""
    near = nearest_combo(matrix, versions)
    outside = observed_range(matrix, versions)
    found = match(matrix, paste, records)
    claimed = claims(found)
    best = claimed[0].score if claimed else 0.0
    full = [m for n, m in enumerate(claimed) if n < DETAILED and m.score >= best - 1]
    also = [m for m in claimed if m not in full]
    platform = [
        PlatformFit(
            rule=h.signature.where,
            versions=rule_versions(h.signature.rule),
            reason=getattr(h.signature.rule, "skip", None) or getattr(h.signature.rule, "reason", None) or "",
            source=getattr(h.signature.rule, "source", "") or "",
        )
        for h in platform_hits(matrix, paste)
    ]
    return Answer(
        errors=[f"{e.type}: {e.message[:300]}" for e in paste.errors[:3]],
        raised_in=next((f.module for f in reversed(paste.frames) if f.module), None),
        versions={p: v for p, v in versions.items() if v},
        versions_from=versions_from,
        outside_observed=outside,
        nearest_combo=near.id if near is not None else None,
        claims=[_claim(matrix, m, paste, versions, near, records, outside) for m in full],
        also=[_also_line(m) for m in also],
        similar=[_similar(m) for m in found if not m.level][:5],
        platform=platform,
        records=None,
    )


def _build_in_budget(matrix: Matrix, paste: Paste, versions, versions_from: str, records: List[Record]) -> Answer:
    """``build``, its regex searches sharing one time budget (a rule regex that backtracks is searched once, not once
    per pasted error and rule); one line on stderr says what the budget skipped."""
    with patterns.budget() as spent:
        answer = build(matrix, paste, versions, versions_from, records)
    if spent.line():
        print(f"triage: {spent.line()}", file=sys.stderr)
    return answer


def _also_line(found: CaseMatch) -> str:
    hit = found.hits[0] if found.hits else None
    via = f"{hit.signature.where}, {_when(hit.signature.rule)}" if hit else "observed records"
    return f"also fits {found.case.id} ({via}, {found.level}): {found.case.report}"


def _similar(found: CaseMatch) -> Similar:
    hit = found.hits[0] if found.hits else None
    reason = found.against or (hit.against if hit and hit.against else None)
    if reason is None:
        reason = (
            "similar message, but the evidence is too thin to claim it ("
            + "; ".join(hit.notes or ["no frame, no context"])
            + ")"
        )
    return Similar(case=found.case.id, rule=hit.signature.where if hit else None, reason=reason)


def _fit_lines(fit: RuleFit) -> List[str]:
    state = {True: "yours are in range", False: "yours are not", None: "yours are unknown"}[fit.in_range]
    lines = [f"   fits {fit.rule} ({fit.when}): {fit.signature}", f"      source: {fit.source}"]
    lines += [f"      note: {note}" for note in fit.notes]
    lines.append(f"      reproduces (rule): {fit.reproduces}; {state}")
    lines.append(f"      fixed (rules): {fit.fixed}")
    return lines + fit.observed


def _claim_lines(n: int, claim: Claim) -> List[str]:
    top = claim.fits[0] if claim.fits else None
    lines = [
        f"{n}. {claim.case}: {claim.title}",
        f"   evidence: {claim.level}" + (f" ({'; '.join(top.evidence)})" if top else ""),
    ]
    lines.append(f"   upstream: {claim.report}")
    for fit in claim.fits:
        lines += _fit_lines(fit)
    lines += [f"   {line}" for line in claim.observed]
    if claim.reproducing_cells:
        lines.append(
            f"   cells expected to raise it on your versions: {claim.reproducing_cells}, e.g. {claim.example_cell}"
        )
    lines += [f"   what works: {'; '.join(claim.what_works)}"] if claim.what_works else []
    if not claim.workarounds:
        return lines + [f"   workarounds: {claim.workarounds_note}"]
    lines.append(
        f"   workarounds expected to hold on {claim.workarounds_on} ({top.rule}'s cells with one setting changed):"
    )
    for w in claim.workarounds:
        lines.append(
            f"    - {with_settings(w.change, w.together)}: {w.rule} {w.when}: {w.cells} cell(s), "
            f"e.g. {', '.join(w.examples)}"
        )
        lines.append(f"      source: {w.source}")
        lines += [f"      {w.observed}"] if w.observed else []
    return lines


def render_text(answer: Answer) -> str:
    """The answer as the text ``triage`` prints."""
    lines = [f"pasted error: {e}" for e in answer.errors]
    if not answer.errors:
        lines.append("pasted error: no exception line found; matching the message text alone")
    if answer.raised_in:
        lines.append(f"innermost pasted frame in a known package: {answer.raised_in}")
    lines.append(f"versions ({answer.versions_from}): {_versions_line(answer.versions)}")
    lines += [f"outside what was observed: {line}" for line in answer.outside_observed]
    if answer.nearest_combo:
        lines.append(f"nearest combo: {answer.nearest_combo}")
    lines.append("")
    if not answer.claims and answer.platform:
        lines.append("No case matches this error; it fits a platform rule (a fact about a release, below).")
    elif not answer.claims:
        lines.append(
            "No known case matches this error: no rule's signature and no observed record fits it well enough."
        )
        lines += [f"   {s.case} ({s.rule or 'records'}): {s.reason}" for s in answer.similar]
        lines.append(
            "If it is a PEFT x FSDP failure, write a case for it (README 'Adding a case'), or start from the "
            "nearest cell's standalone repro: python -m fsdp_matrix export CELL"
        )
    for n, claim in enumerate(answer.claims, 1):
        lines += _claim_lines(n, claim) + [""]
    lines += [f"{n}. {line}" for n, line in enumerate(answer.also, len(answer.claims) + 1)]
    for fit in answer.platform:
        lines.append(f"platform {fit.rule} ({fit.versions}): {fit.reason}")
        lines.append(f"   source: {fit.source}")
    return "\n".join(lines).rstrip() + "\n"


def render(
    matrix: Matrix,
    paste: Paste,
    versions: Mapping[str, Optional[str]],
    versions_from: str,
    records: List[Record],
) -> Tuple[str, int]:
    """The whole answer as text, and how many cases and platform rules it claims."""
    if paste.errors_left_out:
        print(
            f"triage: {len(paste.errors) + paste.errors_left_out} distinct exception lines: matched the first and the "
            f"last {MAX_ERRORS // 2}, {paste.errors_left_out} between them left out",
            file=sys.stderr,
        )
    answer = _build_in_budget(matrix, paste, versions, versions_from, records)
    return render_text(answer), len(answer.claims) + len(answer.also) + len(answer.platform)


def load_records(results: Optional[Path]) -> Tuple[List[Record], List[Skipped]]:
    """The newest record per combo and cell under ``results`` (none without it), and the lines that were not."""
    if results is None:
        return [], []
    if not results.exists():
        raise TriageError(f"--results: {results}: no such file or directory")
    skipped: List[Skipped] = []
    return list(latest(iter_records(results, skipped)).values()), skipped


def _users_versions(given: Optional[Dict[str, str]], text: str) -> Tuple[Dict[str, Optional[str]], str]:
    """The versions to answer on: given with --versions, else those the paste states (an issue's listing), else the
    ones installed here."""
    if given is not None:
        return given, "given with --versions"
    # TRL too: rules bound it (trl <0.29), and "upgrade trl" is only said to someone on an older one
    stated = stated_versions(text, RULE_PACKAGES)
    if stated:
        return {package: stated.get(package) for package in RULE_PACKAGES}, "stated in the paste"
    return installed_versions(PACKAGES), "installed here"


def main(argv: Optional[List[str]] = None) -> int:
    p = OneLineParser(
        prog="fsdp_matrix triage", description="Match a pasted traceback or log against the matrix's known failures."
    )
    p.add_argument("file", nargs="?", help="the traceback or log; '-' or nothing reads stdin")
    # declared once (fsdp_matrix/options.py); the versions are the user's (default: the installed ones)
    options.add_arguments(
        p.add_argument, ("results", "matrix"), defaults={"results": None}, model=options.MatrixOptions
    )
    # checked after parsing, so that main returns its one-line error
    options.add_arguments(p.add_argument, ("versions",), model=options.MatrixOptions, typed=False)
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object (see the docs' schema)")
    args = p.parse_args(argv)
    given = dict(options.check("versions", args.versions)) if args.versions is not None else None
    matrix = load_matrix(args.matrix, check_repros=False)
    records, skipped = load_records(args.results)
    text, cut = _read_paste(args.file)
    versions, versions_from = _users_versions(given, text)
    paste = parse(text)
    if not paste.text and cut:  # /dev/zero: one line that says both, not "cut" then "empty"
        raise TriageError(f"{_CUT} and has no text in its head or tail (NUL bytes, blanks): give the traceback itself")
    if not paste.text:
        raise TriageError("the paste is empty: give a file, or pipe the traceback into stdin")
    if cut:
        print(f"triage: {_CUT}: read its first {MAX_READ >> 20} MiB only", file=sys.stderr)
    if paste.errors_left_out:
        print(
            f"triage: {len(paste.errors) + paste.errors_left_out} distinct exception lines: matched the first and the "
            f"last {MAX_ERRORS // 2}, {paste.errors_left_out} between them left out",
            file=sys.stderr,
        )
    answer = _build_in_budget(matrix, paste, versions, versions_from, records)
    if args.results is not None:
        lost = f", {len(skipped)} lines skipped (not records; first: {skipped[0]})" if skipped else ""
        answer.records = f"records: {len(records)} read from {args.results}{lost}"
    if args.json:
        sys.stdout.write(answer.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write((answer.records + "\n" if answer.records else "") + render_text(answer))
    return 0 if answer.matched else 1
