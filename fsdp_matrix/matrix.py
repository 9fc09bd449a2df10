"""The matrix model: matrix.yaml parsed and validated into typed objects.

pydantic does the validation; this module only turns its errors into one line that names the key, e.g.
``matrix.yaml: cases[1].expect[3].error.match: invalid regex: unbalanced parenthesis``. Beyond types it checks what
a typo would otherwise make silently dead: a ``when`` naming an axis or value no grid has, an empty axis, an empty
version specifier, a duplicate YAML key, a repro file that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Dict, Iterable, List, Literal, Optional, Union

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fsdp_matrix.errors import MatrixConfigError, UnknownCellError

PACKAGES = ("torch", "peft", "transformers", "accelerate", "bitsandbytes")
"""The packages every combo pins and every record reports."""

Scalar = Union[bool, int, float, str]
BUILTIN_AXES = {"device": ("cpu", "cuda"), "world_size": None}
"""Axes every cell has besides its grid's: ``when`` may match them (world size: any positive integer)."""
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
            if not spec.strip():
                # SpecifierSet("") matches every release: a rule meant for some versions would claim them all
                raise ValueError(f"empty specifier for {name} (leave {name} out to match any version)")
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
    grids: List[Dict[str, Annotated[List[Scalar], Field(min_length=1)]]] = Field(min_length=1)
    """Each grid is a product of axes; the case's cells are the union of its grids. An empty axis is refused: it
    would silently drop every cell of its grid."""
    requires: List[Requirement] = []
    expect: List[Rule] = Field(min_length=1)
    """Rules in order; the first that matches a cell gives its expected outcome."""

    def axes(self) -> Dict[str, List[Scalar]]:
        """Every axis of the case's grids with every value it takes."""
        out: Dict[str, List[Scalar]] = {}
        for grid in self.grids:
            for name, values in grid.items():
                out.setdefault(name, []).extend(v for v in values if not any(same_value(v, o) for o in out[name]))
        return out

    @model_validator(mode="after")
    def _known_axes(self) -> Case:
        """A ``when`` naming an axis or a value that no cell has would never match: a dead rule, silently."""
        axes = self.axes()
        named = [(f"expect[{i}].when", rule.when) for i, rule in enumerate(self.expect)]
        named += [(f"requires[{i}].when", req.when) for i, req in enumerate(self.requires)]
        for where, when in named:
            for key, want in when.items():
                if key not in axes and key not in BUILTIN_AXES:
                    have = ", ".join(sorted(axes) + list(BUILTIN_AXES))
                    raise ValueError(f"{where}.{key}: unknown axis {key!r} (this case has: {have})")
                allowed = axes.get(key, BUILTIN_AXES.get(key))
                for value in want if isinstance(want, list) else [want]:
                    if not _allowed(value, allowed):
                        shown = "a positive integer" if allowed is None else ", ".join(map(repr, allowed))
                        raise ValueError(f"{where}.{key}: unknown value {value!r} (the axis has: {shown})")
        return self


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


def same_value(value: Any, want: Any) -> bool:
    """Axis values compare as written, except that YAML writes orig as 0/1 or false/true: those are alike."""
    if isinstance(value, bool) or isinstance(want, bool):
        return isinstance(value, (bool, int)) and isinstance(want, (bool, int)) and bool(value) == bool(want)
    return value == want


def _allowed(value: Any, allowed: Optional[Iterable[Any]]) -> bool:
    if allowed is None:  # world_size
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    return any(same_value(value, a) for a in allowed)


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


def _one_line(text: str) -> str:
    # a message may quote the input (a NUL, a newline inside a value): what the user sees stays one line
    return " ".join(str(text).replace("\x00", "\\x00").split())


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
        raise MatrixConfigError(_one_line(f"{origin}: {_loc(loc, data)}: {msg}{more}")) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error instead of "the last wins"."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor" merges are YAML's own way of overriding keys
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:
                continue  # an unhashable key: the base loader says so
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _yaml_error(path: Path, text: str, exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        # a byte YAML cannot hold at all (NUL, other controls): its own message spans two lines
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        name = {"\x00": "NUL"}.get(char, f"control character #x{ord(char):02x}")
        line = text.count("\n", 0, exc.position) + 1
        return f"{path}: line {line}: not valid YAML: {name} at character {exc.position}"
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}:" if mark else ""
    return f"{path}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}"


def load_matrix(path: Union[str, Path, None] = None, check_repros: bool = True) -> Matrix:
    """Parse and validate a matrix.yaml. ``check_repros``: every case's repro file must exist, relative to the
    file's folder (the report, which only orders its rows by the matrix, does without)."""
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixConfigError(_one_line(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise MatrixConfigError(_one_line(_yaml_error(path, text, exc))) from None
    matrix = parse_matrix(data, origin=path.name)
    if check_repros:
        for i, case in enumerate(matrix.cases):
            if not (path.parent / case.repro).is_file():
                raise MatrixConfigError(
                    _one_line(
                        f"{path.name}: cases[{i}]({case.id}).repro: {case.repro}: no such file "
                        f"(relative to {path.parent})"
                    )
                )
    return matrix
