"""The rule model of matrix.yaml: one ``Rule`` for a case's expectations and requirements and for the platform rules
every case shares, one ``when`` (a mapping, or a list of mappings), one word for the reason (``skip``). How a cell
and an env are matched against a rule is fsdp_matrix.match.

Platform rules hold the facts about an env that are not any case's bug ("FSDP2 has no CPU path before torch 2.7"),
written once. Two kinds, with a fixed precedence (see ``expectations.trace``):

- a **skip** selects cells by axes and versions, like ``requires``, and is tried before the case's own rules, so a
  case's broad ``ok: true`` never hides it;
- a **signature** names an error (type, message regex) that such an env raises: an observed error that no rule of
  the case expected, and that fits a signature, is judged ``skipped`` with the signature's reason. It never changes an
  ok run or an error the case expected.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from fsdp_matrix import patterns
from fsdp_matrix.match import any_when  # noqa: F401 (re-exported: its home before match.py)

PACKAGES = ("torch", "peft", "transformers", "accelerate", "bitsandbytes")
"""The packages every combo pins and every record reports."""
OPTIONAL_PACKAGES = ("trl",)
"""Packages a combo may pin (``trl``: only cells with ``entry: trl`` need it); every record reports them, None when
the env lacks one."""
RULE_PACKAGES = PACKAGES + OPTIONAL_PACKAGES
"""The packages a rule's ``versions`` may name."""
REFUSED = {"torch": "hours of C++/CUDA build", "bitsandbytes": "a native CUDA/CPU build"}
"""Packages never built from source, and why: a combo's ``sources`` and a ``--pin`` refuse them."""

Scalar = Union[bool, int, float, str]


def _valid_regex(value: str) -> str:
    """``value`` if it is a regex a bounded search can use; the one-line error a rule's ``match`` or ``stack`` gives
    otherwise (invalid, or backtracking catastrophically: see patterns.check)."""
    reason = patterns.check(value)
    if reason:
        raise ValueError(reason)
    return value


When = Dict[str, Union[Scalar, List[Scalar]]]
"""Cell params (plus ``device`` and ``world_size``) to match; a list matches any of its values."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_versions(value: Dict[str, str]) -> Dict[str, str]:
    for name, spec in value.items():
        if name not in RULE_PACKAGES:
            raise ValueError(f"unknown package {name!r} (expected one of {', '.join(RULE_PACKAGES)})")
        if not spec.strip():
            # SpecifierSet("") matches every release: a rule meant for some versions would claim them all
            raise ValueError(f"empty specifier for {name} (leave {name} out to match any version)")
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise ValueError(f"invalid specifier for {name}: {spec!r}") from None
    return value


class WarningSignature(Strict):
    """A Python warning: its category's class name and a regex searched in its message."""

    type: str
    """Warning class name, e.g. ``UserWarning`` (matched by name, with or without its module)."""
    match: str

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        return _valid_regex(value)


class ErrorSignature(Strict):
    """An expected error: exception type, a regex searched in the message, and optionally the raising module."""

    type: str
    match: str
    module: Optional[str] = None
    """Module (dotted, prefix match) of the innermost frame that raised, e.g. ``torch.distributed.fsdp._flat_param``."""
    frames: List[str] = []
    """Frames a pasted traceback must show for ``triage`` to tell this error from the same message raised elsewhere:
    a dotted module prefix (``peft.tuners.lora``) or a function name (``generate``). A cell's own record is judged
    without them: a repro's traceback need not pass through ``generate()`` by that name."""
    warning: Optional[WarningSignature] = None
    """A warning the failing run raises before the error, as observed in the cells' records (torch's reentrant
    checkpoint warns that no input requires grad, then backward finds no graph): the cell reproduces only when some
    rank raised it too, and ``triage`` reads the printed warning as the failure's sign. Never on a platform
    signature's ``errors``."""

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        return _valid_regex(value)


class HangExpectation(Strict):
    """The cell is known to hang: it gets a short timeout of its own, and a rank's stack must show where."""

    timeout_s: float = Field(gt=0, le=3600, strict=True)
    """Seconds the cell may run before it is declared hung (instead of the launch's cell timeout), so a known hang
    costs seconds, not minutes."""
    stack: Optional[str] = None
    """Regex searched in every rank's dumped stack: at least one must hold it (a hang elsewhere is another bug)."""

    @field_validator("stack")
    @classmethod
    def _regex(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else _valid_regex(value)


OUTCOMES = ("ok", "error", "skip", "hang", "warning")
"""A rule gives exactly one of these."""
_PLATFORM_ID = r"^[a-z0-9][a-z0-9-]*$"


class Rule(Strict):
    """One rule, in one grammar for every place matrix.yaml has rules: when the cell (``when``) and the env
    (``versions``, ``absent``) fit, this is the outcome. Where it stands says how it is used (``Case``/``Platform``
    check which fields each place takes):

    - a case's ``expect``: the first that fits gives the cell's expected outcome;
    - a case's ``requires``: a ``skip`` with what the cell needs from the machine (``device``, ``min_world_size``);
      unmet, the cell is skipped before it runs;
    - the platform's ``skips``: a ``skip`` tried before every case's rules;
    - the platform's ``signatures``: a ``skip`` with ``errors``: an observed error that the case's rule did not
      expect, and that fits one of them, is judged skipped.

    ``reason:`` is read as ``skip:`` (the platform's and the requirements' spelling before the grammar was one).
    """

    id: Optional[str] = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._+-]*$")
    """Short name, unique in its case (``<case>/<id>`` in ``explain`` and in the case's evidence file,
    ``docs/pages/evidence/<case>.md``, a ``## <case>/<id>`` section), or in the platform's skips or signatures
    (``platform/<id>``, named in records' ``expected``). matrix.yaml names every case rule (a test checks); a platform
    rule must have one."""
    when: Union[When, List[When]] = {}
    """Cell params (plus ``device``, ``world_size`` and ``nodes``) to match, a list in a value matching any of its
    values; or a list of such mappings, of which any may match (e.g. accelerate reached through ``entry:
    accelerate`` or through one of checkpoint-roundtrip's ``save`` paths)."""
    versions: Dict[str, str] = {}
    """Package name -> PEP 440 specifier, e.g. ``{peft: ">=0.14"}``: the envs it is about."""
    absent: List[str] = []
    """Optional packages (OPTIONAL_PACKAGES) the env must lack for the rule to apply, e.g. ``[trl]``: a combo that
    pins no trl cannot run a TRL cell. A ``versions`` specifier cannot say "not installed"."""
    device: Optional[Literal["cuda"]] = None
    """A requirement's device: the cell runs only there."""
    min_world_size: Optional[int] = Field(default=None, ge=1)
    """A requirement's world size: the cell runs only at this many ranks or more."""
    ok: Optional[Literal[True]] = None
    error: Optional[ErrorSignature] = None
    skip: Optional[str] = Field(default=None, min_length=1)
    """Why the cell cannot run in such an env (observed, e.g. no 4-bit on CPU); never a pass or a fail. For a
    signature: the reason an error that fits ``errors`` is judged skipped."""
    hang: Optional[HangExpectation] = None
    """The cell hangs (the bug): reproduced when it is declared hung within ``timeout_s`` and a rank's stack fits."""
    warning: Optional[WarningSignature] = None
    """The cell trains, and raises this warning (the bug): reproduced when some rank's run() raised it."""
    no_warning: Optional[WarningSignature] = None
    """With ``ok``: the cell trains without raising this warning (the fix); raising it is a REGRESSION."""
    errors: List[ErrorSignature] = []
    """A signature's errors: any of these, as the env raises them (the message regex is searched, the module matched
    by prefix)."""
    source: Optional[str] = Field(default=None, min_length=1)
    """Where the behaviour comes from, in one line: the upstream link and the combos it was observed on (every rule
    but a requirement gives one). The longer account of what was read and observed is the rule's evidence (see
    fsdp_matrix.evidence)."""

    @model_validator(mode="before")
    @classmethod
    def _reason_is_skip(cls, data: Any) -> Any:
        if isinstance(data, dict) and "reason" in data:
            if "skip" in data:
                raise ValueError("give the reason once, as skip: (reason: is its older spelling)")
            data = {("skip" if k == "reason" else k): v for k, v in data.items()}
        return data

    @field_validator("versions")
    @classmethod
    def _specifiers(cls, value: Dict[str, str]) -> Dict[str, str]:
        return check_versions(value)

    @field_validator("absent")
    @classmethod
    def _optional(cls, value: List[str]) -> List[str]:
        for name in value:
            if name not in OPTIONAL_PACKAGES:
                raise ValueError(f"{name!r} is not an optional package (one of {', '.join(OPTIONAL_PACKAGES)})")
        return value

    @model_validator(mode="after")
    def _one_outcome(self) -> Rule:
        given = [k for k in OUTCOMES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of {'/'.join(OUTCOMES)}, got {given or 'none'}")
        if self.no_warning is not None and not self.ok:
            raise ValueError(f"no_warning goes with ok, not with {given[0]}")
        return self

    @property
    def reason(self) -> Optional[str]:
        """The skip's reason (a platform rule's or a requirement's ``reason:``)."""
        return self.skip

    def alternatives(self) -> List[When]:
        """The mappings of ``when``, of which any may match."""
        return any_when(self.when)


def _only(rule: Rule, place: str, allowed: Tuple[str, ...], needs: Tuple[str, ...] = ()) -> Rule:
    """``rule`` if it gives only the fields ``allowed`` where it stands (``place``), and every field of ``needs``;
    else pydantic's own error on that field (``expect[3].source: Field required``, ``requires[0].ok: Extra inputs
    are not permitted``), as when each place had a model of its own."""
    errors = [
        InitErrorDetails(type="extra_forbidden", loc=(k,), input=getattr(rule, k))
        for k in sorted(rule.model_fields_set)
        if k not in allowed and getattr(rule, k) not in (None, [], {})
    ]
    errors += [InitErrorDetails(type="missing", loc=(k,), input=place) for k in needs if getattr(rule, k) in (None, [])]
    if errors:
        raise ValidationError.from_exception_data(place, errors)
    return rule


_MATCHING = ("id", "when", "versions", "absent")


def _expect_rule(rule: Rule) -> Rule:
    outcomes = ("ok", "error", "skip", "hang", "warning", "no_warning")
    return _only(rule, "a case's expect", (*_MATCHING, *outcomes, "source"), ("source",))


def _requirement(rule: Rule) -> Rule:
    return _only(rule, "a case's requires", ("id", "when", "device", "min_world_size", "skip", "source"), ("skip",))


def _platform(rule: Rule, kind: str, extra: Tuple[str, ...]) -> Rule:
    _only(rule, f"the platform's {kind}", (*_MATCHING, "skip", "source", *extra), ("id", "skip", "source", *extra))
    if any(e.warning is not None for e in rule.errors):
        # a signature judges an observed error skipped, never reproduced: a warning before it would judge nothing
        raise ValueError(f"platform {kind} {rule.id}: an error of `errors` takes no warning (only a case's rule does)")
    if not re.match(_PLATFORM_ID, rule.id or ""):  # narrower than a case rule's: no dots or pluses
        pattern = dict(type="string_pattern_mismatch", loc=("id",), input=rule.id, ctx={"pattern": _PLATFORM_ID})
        raise ValidationError.from_exception_data(kind, [InitErrorDetails(**pattern)])
    return rule


ExpectRule = Annotated[Rule, AfterValidator(_expect_rule)]
"""A rule of a case's ``expect``."""
Requirement = Annotated[Rule, AfterValidator(_requirement)]
"""A rule of a case's ``requires``: a ``skip`` with the ``device`` or ``min_world_size`` the cell needs."""
PlatformSkip = Annotated[Rule, AfterValidator(lambda rule: _platform(rule, "skips", ()))]
"""A rule of the platform's ``skips``."""
PlatformSignature = Annotated[Rule, AfterValidator(lambda rule: _platform(rule, "signatures", ("errors",)))]
"""A rule of the platform's ``signatures``: a ``skip`` with ``errors``."""
PlatformRule = Rule
"""The platform's rules are Rules (its older name)."""


class Platform(Strict):
    """The ``platform:`` section of matrix.yaml: the facts about an env that are not any case's bug."""

    skips: List[PlatformSkip] = []
    signatures: List[PlatformSignature] = []

    @model_validator(mode="after")
    def _unique_ids(self) -> Platform:
        # a skip and a signature may share an id: one fact, met before the run (an axis says so) or in it
        for kind, rules in (("skips", self.skips), ("signatures", self.signatures)):
            seen = set()
            for rule in rules:
                if rule.id in seen:
                    raise ValueError(f"duplicate platform {kind} id {rule.id!r}")
                seen.add(rule.id)
        return self
