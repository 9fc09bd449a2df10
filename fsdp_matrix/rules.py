"""The rule models of matrix.yaml: a case's expectations and requirements, and the platform rules every case shares.

Platform rules hold the facts about an env that are not any case's bug ("FSDP2 has no CPU path before torch 2.7"),
written once. Two kinds, with a fixed precedence (see ``expectations.trace``):

- a **skip** selects cells by axes and versions, like ``requires``, and is tried before the case's own rules, so a
  case's broad ``ok: true`` never hides it;
- a **signature** names an error (type, message regex) that such an env raises: an observed error that no rule of
  the case expected, and that fits a signature, is judged ``skipped`` with the signature's reason. It never changes an
  ok run or an error the case expected.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fsdp_matrix import patterns

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


class WarningSignature(Strict):
    """A Python warning: its category's class name and a regex searched in its message."""

    type: str
    """Warning class name, e.g. ``UserWarning`` (matched by name, with or without its module)."""
    match: str

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        return _valid_regex(value)


OUTCOMES = ("ok", "error", "skip", "hang", "warning")
"""A rule gives exactly one of these."""


class Rule(Strict):
    """One known behaviour: when params and versions match, this is the expected outcome."""

    id: Optional[str] = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._+-]*$")
    """Short name, unique in its case: the rule is ``<case>/<id>`` in ``explain`` and in the case's evidence file
    (``docs/pages/evidence/<case>.md``, a ``## <case>/<id>`` section). matrix.yaml names every rule (a test checks)."""
    when: When = {}
    """Cell params (plus ``device`` and ``world_size``) to match; a list matches any of its values."""
    versions: Dict[str, str] = {}
    """Package name -> PEP 440 specifier, e.g. ``{peft: ">=0.14"}``."""
    ok: Optional[Literal[True]] = None
    error: Optional[ErrorSignature] = None
    skip: Optional[str] = None
    """Reason the cell cannot run in such an env (observed, e.g. no 4-bit on CPU); never a pass or a fail."""
    hang: Optional[HangExpectation] = None
    """The cell hangs (the bug): reproduced when it is declared hung within ``timeout_s`` and a rank's stack fits."""
    warning: Optional[WarningSignature] = None
    """The cell trains, and raises this warning (the bug): reproduced when some rank's run() raised it."""
    no_warning: Optional[WarningSignature] = None
    """With ``ok``: the cell trains without raising this warning (the fix); raising it is a REGRESSION."""
    source: str = Field(min_length=1)
    """Where the behaviour comes from, in one line: the upstream link and the combos it was observed on. The longer
    account of what was read and observed is the rule's evidence (see fsdp_matrix.evidence)."""

    @field_validator("versions")
    @classmethod
    def _specifiers(cls, value: Dict[str, str]) -> Dict[str, str]:
        return check_versions(value)

    @model_validator(mode="after")
    def _one_outcome(self) -> Rule:
        given = [k for k in OUTCOMES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of {'/'.join(OUTCOMES)}, got {given or 'none'}")
        if self.no_warning is not None and not self.ok:
            raise ValueError(f"no_warning goes with ok, not with {given[0]}")
        return self


class Requirement(Strict):
    """A condition a cell needs from the machine; unmet means skipped with ``reason``."""

    when: When = {}
    device: Optional[Literal["cuda"]] = None
    min_world_size: Optional[int] = Field(default=None, ge=1)
    reason: str = Field(min_length=1)


class PlatformRule(Strict):
    """A fact about an env that any case can meet, written once for all of them."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Named in explain's output, in records' ``expected`` and in the line of a judged cell."""
    when: Union[When, List[When]] = {}
    """Cells it is about: one mapping, or a list of mappings of which any may match (e.g. accelerate reached
    through ``entry: accelerate`` or through one of checkpoint-roundtrip's ``save`` paths)."""
    versions: Dict[str, str] = {}
    """Package name -> PEP 440 specifier: the envs it is about."""
    reason: str = Field(min_length=1)
    """The fact, as the skipped cell's reason."""
    source: str = Field(min_length=1)
    """The observation it was written from, in one line; the longer account is its evidence (``## platform/<id>``
    in ``docs/pages/evidence/platform.md``)."""

    @field_validator("versions")
    @classmethod
    def _specifiers(cls, value: Dict[str, str]) -> Dict[str, str]:
        return check_versions(value)

    def alternatives(self) -> List[When]:
        return list(self.when) if isinstance(self.when, list) else [self.when]


class PlatformSkip(PlatformRule):
    """Skip the selected cells before they run (tried before the case's rules)."""

    absent: List[str] = []
    """Optional packages (OPTIONAL_PACKAGES) the env must lack for the skip to apply, e.g. ``[trl]``: a combo that
    pins no trl cannot run a TRL cell. A ``versions`` specifier cannot say "not installed"."""

    @field_validator("absent")
    @classmethod
    def _optional(cls, value: List[str]) -> List[str]:
        for name in value:
            if name not in OPTIONAL_PACKAGES:
                raise ValueError(f"{name!r} is not an optional package (one of {', '.join(OPTIONAL_PACKAGES)})")
        return value


class PlatformSignature(PlatformRule):
    """Judge an observed error that no rule of the case expected ``skipped``, when it fits one of ``errors``."""

    errors: List[ErrorSignature] = Field(min_length=1)
    """Any of these, as the env raises them (the message regex is searched, the module matched by prefix)."""


class Platform(Strict):
    """The ``platform:`` section of matrix.yaml."""

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


def any_when(value: Any) -> List[When]:
    """The mappings of a ``when`` that may be one mapping or a list of them."""
    return list(value) if isinstance(value, list) else [value]
