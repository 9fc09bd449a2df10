"""Expectations: which matrix.yaml rule applies to a cell in an env, and whether an observed error fits it.

``trace`` is the one place that decides: it tries every rule in order and keeps each trial (matched or not, and
why); ``expected_for`` is its verdict and ``explain`` prints its trials, so the two cannot disagree. The order:

1. the case's ``requires`` (the machine: device, world size; the session checks them first and skips the cell),
2. the platform's skips (shared facts about an env; before the case's rules, so a broad ``ok: true`` never hides
   them),
3. the case's ``expect`` rules, first match wins,
4. the platform's signatures: carried in the Expected, used by ``verdicts.judge`` only on an observed error that
   the case's rule did not expect.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from fsdp_matrix import patterns
from fsdp_matrix.cells import Cell, unmet_requirement
from fsdp_matrix.match import hits, unmet, version_matches, version_mismatch, why  # noqa: F401 (re-exported)
from fsdp_matrix.matrix import Case, Rule
from fsdp_matrix.rules import ErrorSignature, PlatformRule


@dataclass(frozen=True)
class Expected:
    """The expected outcome of one cell in one env."""

    kind: str
    """``ok``, ``error``, ``skip``, ``hang``, ``warning`` (trains, and raises a warning), or ``none`` when no rule
    matched (always a failure: matrix.yaml needs a rule)."""
    error_type: Optional[str] = None
    """Expected exception class name (kind ``error``)."""
    match: Optional[str] = None
    """Regex searched in the error message (kind ``error``), or in the ranks' stacks (kind ``hang``)."""
    module: Optional[str] = None
    """Expected raising module prefix, if the rule gives one."""
    reason: Optional[str] = None
    """Why the cell is skipped (kind ``skip``)."""
    rule: Optional[int] = None
    """Index of the matching rule in the case's ``expect`` list."""
    source: Optional[str] = None
    """The rule's citation."""
    platform: Optional[str] = None
    """Id of the platform skip that gave this outcome (then ``rule`` is None)."""
    timeout_s: Optional[float] = None
    """The cell's own timeout (kind ``hang``); None: the launch's cell timeout."""
    warning: Optional[Dict[str, str]] = None
    """``{type, match}``: the warning some rank must raise (kind ``warning``; with kind ``error``, before the
    error: the error signature's ``warning``)."""
    no_warning: Optional[Dict[str, str]] = None
    """``{type, match}``: a warning no rank may raise (kind ``ok``)."""
    signatures: Tuple[Dict[str, Any], ...] = ()
    """The platform signatures that apply to this cell and env: ``{id, reason, source, errors: [{type, match,
    module}]}``. An observed error the rule did not expect that fits one is judged skipped."""

    def describe(self) -> str:
        if self.kind == "ok":
            return "ok" + (f", without {_warning_text(self.no_warning)}" if self.no_warning else "")
        if self.kind == "warning":
            return f"ok, with {_warning_text(self.warning)}"
        if self.kind == "hang":
            where = f", a rank's stack matching /{self.match}/" if self.match else ""
            return f"hang within {self.timeout_s:g}s{where}"
        if self.kind == "error":
            where = f" in {self.module}" if self.module else ""
            before = f", after {_warning_text(self.warning)}" if self.warning else ""
            return f"{self.error_type}: /{self.match}/{where}{before}"
        if self.kind == "skip":
            return f"skip ({self.reason})"
        return "no rule matches"

    def to_json(self) -> Dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "signatures"}
        if self.signatures:
            out["signatures"] = [dict(s) for s in self.signatures]
        return out

    def judges_like(self, recorded: Mapping[str, Any]) -> bool:
        """Would a record made under ``recorded`` (an earlier ``to_json``) get the verdict this expectation gives the
        same observation? Everything but the rule's citation and its index counts: a reworded ``source`` or a rule
        inserted above it changes no verdict; a new match, kind, module or skip does."""
        citation = ("source", "rule")
        return {k: v for k, v in self.to_json().items() if k not in citation} == {
            k: v for k, v in recorded.items() if k not in citation
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Expected:
        fields = {k: data.get(k) for k in cls.__dataclass_fields__ if k != "signatures"}
        return cls(**fields, signatures=tuple(data.get("signatures") or ()))


def _warning_text(sig: Optional[Mapping[str, str]]) -> str:
    return f"{sig['type']}: /{sig['match']}/" if sig else ""


@dataclass(frozen=True)
class Trial:
    """One rule tried for a cell: where it is, whether it matched, and why."""

    stage: str
    """``requires``, ``platform skip``, ``case rule`` or ``platform signature``."""
    name: str
    """Where the rule is in matrix.yaml: ``requires[0]``, ``platform.skips[0](fsdp2-no-cpu)``, ``expect[3]``."""
    matched: bool
    """Its ``when`` and ``versions`` (or requirement) hold for this cell and env."""
    why: str
    """The ``when`` key or version specifier that failed, or what matched."""
    outcome: str
    """What the rule says: ``skip (...)``, ``ok``, ``ValueError: /.../``."""
    decides: bool = False
    """The first unmet requirement (the session skips the cell), or the first matching rule (its outcome is the
    cell's Expected, recorded even when a requirement skips the cell)."""


@dataclass(frozen=True)
class Trace:
    """Every rule tried for one cell in one env, and what they decide."""

    trials: Tuple[Trial, ...]
    """In the order they are tried."""
    requirement: Optional[str]
    """The unmet requirement that skips the cell before any rule, or None."""
    expected: Expected
    """The outcome of the platform skips and the case's rules (requirements aside, as the session records it)."""


def rule_matches(rule: Rule, cell: Cell, versions: Mapping[str, Optional[str]]) -> bool:
    return hits(rule, cell.context(), versions)


def _rule_expected(rule: Rule, index: int) -> Expected:
    if rule.ok:
        quiet = rule.no_warning.model_dump() if rule.no_warning else None
        return Expected("ok", rule=index, source=rule.source, no_warning=quiet)
    if rule.skip is not None:
        return Expected("skip", reason=rule.skip, rule=index, source=rule.source)
    if rule.hang is not None:
        return Expected("hang", match=rule.hang.stack, timeout_s=rule.hang.timeout_s, rule=index, source=rule.source)
    if rule.warning is not None:
        return Expected("warning", warning=rule.warning.model_dump(), rule=index, source=rule.source)
    err = rule.error
    before = err.warning.model_dump() if err.warning else None
    return Expected("error", err.type, err.match, err.module, rule=index, source=rule.source, warning=before)


def _signature_json(rule: PlatformRule) -> Dict[str, Any]:
    # frames are triage's hints, not part of judging a record: the record's shape stays as it was
    errors = [e.model_dump(exclude_none=True, exclude={"frames"}) for e in getattr(rule, "errors", [])]
    return {"id": rule.id, "reason": rule.reason, "source": rule.source, "errors": errors}


def _requirement_trials(case: Case, cell: Cell) -> List[Trial]:
    """The case's ``requires``, each tried for ``cell``: the first unmet one decides (the session skips the cell)."""
    trials: List[Trial] = []
    ctx = cell.context()
    for i, req in enumerate(case.requires):
        held, miss = why(req, ctx, {})
        need = f"device {req.device}" if req.device else f"world size >= {req.min_world_size}"
        not_met = held and unmet(req, ctx) is not None
        why_text = miss if not held else (f"unmet: needs {need}" if not_met else f"met: needs {need}")
        decides = not_met and not any(t.decides for t in trials)
        trials.append(Trial("requires", f"requires[{i}]", not_met, why_text, f"skip ({req.reason})", decides))
    return trials


def trace(case: Case, cell: Cell, versions: Mapping[str, Optional[str]]) -> Trace:
    """Try every rule for ``cell`` under the installed ``versions``, in order (see the module docstring)."""
    trials = _requirement_trials(case, cell)
    requirement = unmet_requirement(case.requires, cell)
    expected: Optional[Expected] = None
    ctx = cell.context()
    for i, skip in enumerate(case.platform.skips):
        hit, said = why(skip, ctx, versions)
        decides = hit and expected is None
        if decides:
            expected = Expected("skip", reason=skip.reason, source=skip.source, platform=skip.id)
        trials.append(
            Trial(
                "platform skip",
                f"platform.skips[{i}]({skip.id})",
                hit,
                said,
                f"skip ({skip.reason})",
                decides,
            )
        )
    for i, rule in enumerate(case.expect):
        hit, said = why(rule, ctx, versions)
        decides = hit and expected is None
        if decides:
            expected = _rule_expected(rule, i)
        trials.append(
            Trial(
                "case rule",
                f"expect[{i}]",
                hit,
                said,
                _rule_expected(rule, i).describe(),
                decides,
            )
        )
    signatures = []
    for i, sig in enumerate(case.platform.signatures):
        hit, said = why(sig, ctx, versions)
        if hit:
            signatures.append(_signature_json(sig))
        fits = " or ".join(f"{e.type}: /{e.match}/" for e in sig.errors)
        trials.append(
            Trial(
                "platform signature",
                f"platform.signatures[{i}]({sig.id})",
                hit,
                said,
                f"skipped ({sig.reason}) if an error the case did not expect fits {fits}",
            )
        )
    expected = expected or Expected("none")
    if signatures:
        expected = Expected(**{**expected.__dict__, "signatures": tuple(signatures)})
    return Trace(tuple(trials), requirement, expected)


def expected_for(case: Case, cell: Cell, versions: Mapping[str, Optional[str]]) -> Expected:
    """The outcome the platform's skips, then the case's first matching rule, give this cell under these installed
    versions, with the platform signatures that apply. No match is kind ``none``.

    ``trace(...).expected`` without the trace: the same first match (tests/test_expectations.py compares the two on
    every cell of every combo), but it stops there and words no reason, as a matrix judges tens of thousands of cells.
    """
    ctx = cell.context()
    expected = next(
        (
            Expected("skip", reason=skip.reason, source=skip.source, platform=skip.id)
            for skip in case.platform.skips
            if hits(skip, ctx, versions)
        ),
        None,
    )
    if expected is None:
        rules = enumerate(case.expect)
        expected = next((_rule_expected(r, i) for i, r in rules if hits(r, ctx, versions)), None)
    expected = expected or Expected("none")
    signatures = [_signature_json(sig) for sig in case.platform.signatures if hits(sig, ctx, versions)]
    if signatures:
        expected = Expected(**{**expected.__dict__, "signatures": tuple(signatures)})
    return expected


def error_fits(
    sig: ErrorSignature | Mapping[str, Any],
    error_type: Optional[str],
    message: Optional[str],
    location: Optional[str],
) -> bool:
    """Does an observed error fit a signature? Type by class name, regex searched, module by prefix."""
    want = sig if isinstance(sig, Mapping) else sig.model_dump()
    if not error_type:
        return False
    if error_type != want["type"] and error_type.rsplit(".", 1)[-1] != want["type"]:
        return False
    if not patterns.search(want.get("match") or "", message or ""):
        return False
    if want.get("module"):
        mod = location or ""
        return mod == want["module"] or mod.startswith(want["module"] + ".")
    return True


def signature_matches(
    expected: Expected, error_type: Optional[str], message: Optional[str], location: Optional[str]
) -> bool:
    """Does an observed error fit the expected signature? Type by class name, regex searched, module by prefix."""
    if expected.kind != "error":
        return False
    want = {"type": expected.error_type, "match": expected.match, "module": expected.module}
    return error_fits(want, error_type, message, location)


def platform_signature(
    expected: Expected, error_type: Optional[str], message: Optional[str], location: Optional[str]
) -> Optional[Dict[str, Any]]:
    """The first platform signature carried by ``expected`` that the observed error fits, or None."""
    for sig in expected.signatures:
        if any(error_fits(e, error_type, message, location) for e in sig.get("errors", ())):
            return sig
    return None


def _type_fits(want: str, got: Optional[str]) -> bool:
    return bool(got) and (got == want or got.rsplit(".", 1)[-1] == want)


def warning_raised(sig: Mapping[str, str], warnings: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The first recorded warning (``{category, message, ...}``, see RankResult.warnings) that fits ``{type,
    match}``: the category by class name, with or without its module; the regex searched in the message."""
    for w in warnings:
        if _type_fits(sig["type"], w.get("category")) and patterns.search(sig["match"], w.get("message") or ""):
            return w
    return None


def stack_fits(expected: Expected, stacks: Sequence[Optional[str]]) -> bool:
    """Does a hang fit a ``hang`` rule: without a stack regex any hang does; with one, some rank's stack holds it."""
    if expected.match is None:
        return True
    return any(patterns.search(expected.match, s) for s in stacks if s)
