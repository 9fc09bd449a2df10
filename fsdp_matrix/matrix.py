"""The matrix model: matrix.yaml parsed and validated into typed objects.

pydantic does the validation; this module only turns its errors into one line that names the key, e.g.
``matrix.yaml: cases[1].expect[3].error.match: invalid regex: unbalanced parenthesis``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fsdp_matrix.errors import MatrixConfigError, UnknownCellError

PACKAGES = ("torch", "peft", "transformers", "accelerate", "bitsandbytes")
"""The packages every combo pins and every record reports."""

Scalar = Union[bool, int, float, str]
DEFAULT_MATRIX = Path(__file__).resolve().parent.parent / "matrix.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pins(_Strict):
    """Exact versions of the five packages under test."""

    torch: str
    peft: str
    transformers: str
    accelerate: str
    bitsandbytes: str

    @field_validator("*")
    @classmethod
    def _exact(cls, value: str) -> str:
        try:
            Version(value)
        except InvalidVersion:
            raise ValueError(f"not an exact version: {value!r}") from None
        return value


class Combo(_Strict):
    """One pinned version combination: one nox session, one env."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    pins: Pins
    extra: List[str] = []
    """Extra requirement strings the era needs, e.g. ``numpy<2``."""
    tags: List[str] = []
    """Session tags: ``cpu``, ``gpu``, ``nightly``, ``tests``, ``mixed``..."""
    python: Optional[str] = None
    """Python version for the env; None means the interpreter running nox."""
    notes: str = ""
    allow_cuda_build: bool = False
    """A CPU run may install the CUDA build of torch when no CPU build of the pin is reachable through the user's
    pip/uv configuration (about 3 GB, announced with its size before the download). The torch axis needs it: only
    torch 2.13.0 has a local CPU build here. The default ``cpu`` combos leave it off and refuse a CUDA torch."""
    floating: bool = False
    """The pins are a last known resolution, not what runs: at run time every package resolves to its newest
    release on the configured indexes (``newest``), and the records hold the exact versions installed."""

    def requirements(self) -> List[str]:
        return [f"{name}=={version}" for name, version in self.pins.model_dump().items()] + list(self.extra)

    def with_pins(self, **versions: str) -> Combo:
        """The same combo with some pins replaced (a floating combo resolved, an upgrade's target)."""
        return self.model_copy(update={"pins": Pins(**{**self.pins.model_dump(), **versions})})


class ErrorSignature(_Strict):
    """An expected error: exception type, a regex searched in the message, and optionally the raising module."""

    type: str
    match: str
    module: Optional[str] = None
    """Module (dotted, prefix match) of the innermost frame that raised, e.g. ``torch.distributed.fsdp._flat_param``."""

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regex: {exc}") from None
        return value


class Rule(_Strict):
    """One known behaviour: when params and versions match, this is the expected outcome."""

    when: Dict[str, Union[Scalar, List[Scalar]]] = {}
    """Cell params (plus ``device`` and ``world_size``) to match; a list matches any of its values."""
    versions: Dict[str, str] = {}
    """Package name -> PEP 440 specifier, e.g. ``{peft: ">=0.14"}``."""
    ok: Optional[Literal[True]] = None
    error: Optional[ErrorSignature] = None
    skip: Optional[str] = None
    """Reason the cell cannot run in such an env (observed, e.g. no 4-bit on CPU); never a pass or a fail."""
    source: str = Field(min_length=1)
    """Where the behaviour comes from: seed report, issue or PR number, observation."""

    @field_validator("versions")
    @classmethod
    def _specifiers(cls, value: Dict[str, str]) -> Dict[str, str]:
        for name, spec in value.items():
            if name not in PACKAGES:
                raise ValueError(f"unknown package {name!r} (expected one of {', '.join(PACKAGES)})")
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise ValueError(f"invalid specifier for {name}: {spec!r}") from None
        return value

    @model_validator(mode="after")
    def _one_outcome(self) -> Rule:
        given = [k for k in ("ok", "error", "skip") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of ok/error/skip, got {given or 'none'}")
        return self


class Requirement(_Strict):
    """A condition a cell needs from the machine; unmet means skipped with ``reason``."""

    when: Dict[str, Union[Scalar, List[Scalar]]] = {}
    device: Optional[Literal["cuda"]] = None
    min_world_size: Optional[int] = None
    reason: str = Field(min_length=1)


class Case(_Strict):
    """A reported failure: its grids of cells, what they need, and the expected outcome per version range."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    report: str
    """Where the failure was reported (seed report, upstream issue)."""
    repro: str
    """Path of the standalone repro script, relative to the repo root."""
    grids: List[Dict[str, List[Scalar]]] = Field(min_length=1)
    """Each grid is a product of axes; the case's cells are the union of its grids."""
    requires: List[Requirement] = []
    expect: List[Rule] = Field(min_length=1)
    """Rules in order; the first that matches a cell gives its expected outcome."""


class Matrix(_Strict):
    """The whole of matrix.yaml."""

    combos: List[Combo] = Field(min_length=1)
    cases: List[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> Matrix:
        for kind, items in (("combos", self.combos), ("cases", self.cases)):
            seen = set()
            for item in items:
                if item.id in seen:
                    raise ValueError(f"duplicate {kind} id {item.id!r}")
                seen.add(item.id)
        return self

    def combo(self, combo_id: str) -> Combo:
        for combo in self.combos:
            if combo.id == combo_id:
                return combo
        raise UnknownCellError(f"no combo {combo_id!r} in matrix.yaml (have: {', '.join(c.id for c in self.combos)})")

    def newest(self, tag: str = "cpu") -> Combo:
        """The combo tagged ``tag`` with the newest peft, then transformers, accelerate, torch, bitsandbytes: what
        ``bisect``, ``export`` and ``upgrade`` use when no ``--combo`` is given."""
        tagged = [c for c in self.combos if tag in c.tags]
        if not tagged:
            raise UnknownCellError(f"no combo tagged {tag!r} in matrix.yaml; pass --combo")
        order = ("peft", "transformers", "accelerate", "torch", "bitsandbytes")
        return max(tagged, key=lambda c: tuple(Version(getattr(c.pins, n)) for n in order))

    def case(self, case_id: str) -> Case:
        for case in self.cases:
            if case.id == case_id:
                return case
        raise UnknownCellError(f"no case {case_id!r} in matrix.yaml (have: {', '.join(c.id for c in self.cases)})")


def _loc(loc: tuple, data: Any) -> str:
    """Render a pydantic error location as ``cases[1].expect[0].error.match``, naming ids where known."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and "id" in node:
                out += f"({node['id']})"
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "<top level>"


def parse_matrix(data: Any, origin: str = "matrix.yaml") -> Matrix:
    try:
        return Matrix.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        # pydantic puts the union/model tag (e.g. "function-after[...]") in loc; drop those parts
        loc = tuple(
            p
            for p in err["loc"]
            if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "bool", "float", "list[...]")))
        )
        msg = err["msg"].removeprefix("Value error, ")
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise MatrixConfigError(f"{origin}: {_loc(loc, data)}: {msg}{more}") from None


def load_matrix(path: Union[str, Path, None] = None) -> Matrix:
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise MatrixConfigError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_matrix(data, origin=path.name)
