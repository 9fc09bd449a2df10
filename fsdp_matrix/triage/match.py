"""Which rules and records a pasted error fits, and what the matrix knows about each matching case.

A rule fits when its regex is found in a pasted exception message (backticks and line breaks ignored on both
sides). The exception type and the raising module (from the frames' file paths) raise or lower the score but are
not required: users paste a trimmed tail, and another release may raise the same message from another module.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional

from packaging.version import InvalidVersion, Version

from fsdp_matrix.cells import Cell, expand_case
from fsdp_matrix.expectations import expected_for, version_matches
from fsdp_matrix.matrix import Case, Combo, Matrix
from fsdp_matrix.records import Record
from fsdp_matrix.triage.parse import Paste

SIMILAR = 0.75
"""How alike (difflib ratio, numbers masked) a record's message and a pasted one must be to call them the same."""
WEIGHTS = {"peft": 3.0, "torch": 2.0, "transformers": 1.0, "accelerate": 1.0, "bitsandbytes": 0.5}
"""How much a minor release apart in each package counts when looking for the combo nearest to the user's."""


@dataclass(frozen=True)
class Signature:
    """An error signature from matrix.yaml: a case's ``expect`` rule, or a platform rule."""

    case: Optional[str]
    """The case id; None for a platform rule."""
    where: str
    """``expect[3]`` or ``platform[0]``: which rule it is."""
    rule: Any
    """The rule object (``when``, ``versions``, ``source``, and ``error`` or ``signature``)."""

    @property
    def error(self) -> Any:
        return getattr(self.rule, "error", None) or getattr(self.rule, "signature", None)


@dataclass
class Hit:
    """One signature that fits the paste."""

    signature: Signature
    score: float
    """Higher is a closer fit: message 4, same type 2, same raising module 1, the case's own report 1 (+0.5 for the
    report the case was written from); a paste whose frames are all elsewhere -1."""
    notes: List[str] = field(default_factory=list)
    """Why the fit is partial (another type, another module), shown to the user."""


@dataclass
class CaseMatch:
    """A case the paste fits, through its rules, its observed records, or both."""

    case: Case
    """The case from matrix.yaml."""
    hits: List[Hit] = field(default_factory=list)
    """Its rules that fit, best first."""
    records: List[Record] = field(default_factory=list)
    """Records of this case whose observed error is the pasted one."""

    @property
    def score(self) -> float:
        best = max((h.score for h in self.hits), default=0.0)
        return best + (0.5 if self.records else 0.0)


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _pattern(regex: str) -> str:
    # users' pastes and other releases drop the backticks that some messages quote names with
    return regex.replace("`?", "").replace("`", "")


def _platform_rules(matrix: Matrix) -> List[Any]:
    """Platform rules with a signature, whatever shape the ``platform`` section has (a list, or a model of lists)."""
    platform = getattr(matrix, "platform", None)
    if platform is None:
        return []
    items = platform if isinstance(platform, (list, tuple)) else []
    if not items:
        for value in (getattr(platform, "__dict__", None) or {}).values():
            items += list(value) if isinstance(value, (list, tuple)) else []
    return [r for r in items if getattr(r, "error", None) or getattr(r, "signature", None)]


def signatures(matrix: Matrix) -> List[Signature]:
    """Every error signature of matrix.yaml: each case's ``expect`` errors, then the platform's."""
    out = [
        Signature(case.id, f"expect[{i}]", rule)
        for case in matrix.cases
        for i, rule in enumerate(case.expect)
        if rule.error is not None
    ]
    return out + [Signature(None, f"platform[{i}]", rule) for i, rule in enumerate(_platform_rules(matrix))]


def _cites_own_report(case: Optional[Case], source: str) -> bool:
    """The rule's source opens with the case's own report (``peft#1702 (...)``, ``PR #2167: ...``): the rule is
    that report's failure, not the same error met by another case on its way."""
    if case is None:
        return False
    numbers = set(re.findall(r"#(\d+)", case.report)) | set(re.findall(r"/(?:issues|pull)/(\d+)", case.report))
    opening = re.match(r"\s*[\w./-]*?(?:PR\s*)?#(\d+)", source)
    return bool(opening) and opening.group(1) in numbers


def _primary_report(case: Optional[Case]) -> Optional[str]:
    """The first issue or PR number the case's report names: the report the case was written from."""
    found = re.search(r"(?:#|/(?:issues|pull)/)(\d+)", case.report) if case else None
    return found.group(1) if found else None


LOOSE_WORDS = 6
"""A rule's regex needs this many words before a loose fit is tried: a short message must match exactly."""
LOOSE_COVER = 0.8
"""The share of the regex's words a message of the same exception class must hold to fit loosely."""


def _words(text: str) -> set:
    return set(re.findall(r"[a-z][a-z0-9_]+", text.lower()))


def _loose(regex: str, message: str) -> bool:
    """The regex's literal words are (nearly) all in the message: e.g. the dtypes named the other way round
    (``float32 and bfloat16``: FSDP1 names the first dtype it met), which the regex's order does not allow."""
    wanted = _words(re.sub(r"\\.", " ", _pattern(regex)))
    if len(wanted) < LOOSE_WORDS:
        return False
    return len(wanted & _words(message)) >= LOOSE_COVER * len(wanted)


def fit(sig: Signature, paste: Paste, case: Optional[Case] = None) -> Optional[Hit]:
    """How well a signature fits the paste, or None when its message is not in it."""
    err = sig.error
    try:
        regex = re.compile(_pattern(err.match))
    except re.error:
        return None
    want = str(err.type).rsplit(".", 1)[-1]
    notes: List[str] = []
    found = [e for e in paste.errors if regex.search(_plain(e.message))]
    if found:
        score = 4.0
        if any(e.short_type == want for e in found):
            score += 2
        else:
            notes.append(f"pasted as {found[0].type}, the rule says {want}")
    elif regex.search(_plain(paste.text)):
        score = 3.0  # no exception line (a message quoted in prose, a cut-off paste): the message alone
        notes.append("message found in the text, no exception line")
    elif any(e.short_type == want and _loose(err.match, e.message) for e in paste.errors):
        score = 2.0
        notes.append("loose fit: the rule's words are in the message, its regex is not (another order or wording)")
    else:
        return None
    module = getattr(err, "module", None)
    if module and paste.modules:
        if any(m == module or m.startswith(module + ".") for m in paste.modules):
            score += 1
        else:
            notes.append(f"no pasted frame is in {module}")
            score -= 1
    source = getattr(sig.rule, "source", "") or ""
    if _cites_own_report(case, source):
        score += 1
        # among the case's own rules, the one of the report it was written from (peft#2166 before PR #2167)
        primary = _primary_report(case)
        score += 0.5 if primary and re.match(rf"\s*[\w./-]*?(?:PR\s*)?#{primary}\b", source) else 0
    return Hit(sig, score, notes)


def _mask(text: str) -> str:
    return re.sub(r"\d+", "#", _plain(text).lower())


def record_fits(record: Record, paste: Paste) -> bool:
    """Is the record's observed error the pasted one? Same class name, and alike messages (numbers masked)."""
    obs = record.observed
    if not obs.error_type or not obs.error_message:
        return False
    mine = _mask(obs.error_message)
    for err in paste.errors:
        if err.short_type != obs.error_type.rsplit(".", 1)[-1]:
            continue
        theirs = _mask(err.message)
        short, long = sorted((mine, theirs), key=len)
        if len(short) >= 20 and short in long:
            return True
        if difflib.SequenceMatcher(None, mine[:300], theirs[:300]).ratio() >= SIMILAR:
            return True
    return False


def match(matrix: Matrix, paste: Paste, records: Iterable[Record] = ()) -> List[CaseMatch]:
    """The cases the paste fits, best first."""
    by_case: Dict[str, CaseMatch] = {}
    cases = {c.id: c for c in matrix.cases}
    for sig in signatures(matrix):
        case = cases.get(sig.case) if sig.case else None
        hit = fit(sig, paste, case)
        if hit is None or case is None:
            continue
        by_case.setdefault(case.id, CaseMatch(case)).hits.append(hit)
    for record in records:
        if record.case in cases and record_fits(record, paste):
            by_case.setdefault(record.case, CaseMatch(cases[record.case])).records.append(record)
    for found in by_case.values():
        found.hits.sort(key=lambda h: -h.score)
    return sorted(by_case.values(), key=lambda m: -m.score)


def platform_hits(matrix: Matrix, paste: Paste) -> List[Hit]:
    """Platform signatures the paste fits (a fact about a release, not about one case)."""
    hits = [fit(sig, paste) for sig in signatures(matrix) if sig.case is None]
    return sorted((h for h in hits if h), key=lambda h: -h.score)


def _minor(version: Optional[str]) -> Optional[float]:
    try:
        release = Version(version).release if version else None
    except InvalidVersion:
        return None
    return release[0] * 1000 + (release[1] if len(release) > 1 else 0) if release else None


def distance(versions: Mapping[str, Optional[str]], combo: Combo) -> float:
    """Minor releases between the user's versions and a combo's pins, weighted by package (unknown ones ignored)."""
    total = 0.0
    for package, weight in WEIGHTS.items():
        mine, theirs = _minor(versions.get(package)), _minor(getattr(combo.pins, package))
        if mine is not None and theirs is not None:
            total += weight * abs(mine - theirs)
    return total


def nearest_combo(matrix: Matrix, versions: Mapping[str, Optional[str]], tag: str = "cpu") -> Optional[Combo]:
    """The ``tag`` combo nearest to the user's versions; None when no version is known."""
    if not any(versions.get(p) for p in WEIGHTS):
        return None
    tagged = [c for c in matrix.combos if tag in c.tags] or list(matrix.combos)
    return min(tagged, key=lambda c: distance(versions, c))


def reproducing_cells(case: Case, paste: Paste, versions: Mapping[str, Optional[str]]) -> List[Cell]:
    """The case's CPU cells whose expected error on these versions is the pasted one."""
    out = []
    for cell in expand_case(case):
        rule = _rule_for(case, cell, versions)
        if rule is not None and rule.error is not None and fit(Signature(case.id, "", rule), paste):
            out.append(cell)
    return out


def _rule_for(case: Case, cell: Cell, versions: Mapping[str, Optional[str]]) -> Any:
    expected = expected_for(case, cell, versions)
    return case.expect[expected.rule] if expected.rule is not None else None


def workarounds(case: Case, versions: Mapping[str, Optional[str]]) -> Dict[int, List[Cell]]:
    """The case's CPU cells expected to train on these versions, by the ``ok`` rule that says so."""
    out: Dict[int, List[Cell]] = {}
    for cell in expand_case(case):
        expected = expected_for(case, cell, versions)
        if expected.kind == "ok" and expected.rule is not None:
            out.setdefault(expected.rule, []).append(cell)
    return out


def rule_versions(rule: Any) -> str:
    """``peft <0.14, accelerate >=0.30`` or ``any version``."""
    specs = getattr(rule, "versions", None) or {}
    return ", ".join(f"{p} {s}" for p, s in specs.items()) or "any version"


def in_range(rule: Any, versions: Mapping[str, Optional[str]]) -> Optional[bool]:
    """Whether the user's versions are in the rule's range; None when a version it names is unknown."""
    specs = getattr(rule, "versions", None) or {}
    if any(versions.get(p) is None for p in specs):
        return None
    return all(version_matches(s, versions.get(p)) for p, s in specs.items())
