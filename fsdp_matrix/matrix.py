"""The matrix model: matrix.yaml parsed and validated into typed objects.

pydantic does the validation; this module only turns its errors into one line that names the key, e.g.
``matrix.yaml: cases[1].expect[3].error.match: invalid regex: unbalanced parenthesis``. Beyond types it checks what
a typo would otherwise make silently dead: a ``when`` naming an axis or value no grid has, an empty axis, an empty
version specifier, a duplicate YAML key, a repro file that does not exist.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Requirement508
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, field_validator, model_validator

from fsdp_matrix.axes import (
    BUILTIN_AXES,
    LAYOUT_AXES,
    Axis,
    allowed,
    check_grids,
    max_cells,
    name_problem,
    same_value,
    shown,
    value_problem,
)  # noqa: F401 (same_value re-exported)
from fsdp_matrix.errors import MatrixConfigError, UnknownCellError
from fsdp_matrix.rules import (  # noqa: F401 (re-exported: the models' home before the split)
    OPTIONAL_PACKAGES,
    PACKAGES,
    RULE_PACKAGES,
    ErrorSignature,
    ExpectRule,
    Platform,
    PlatformSignature,
    PlatformSkip,
    Requirement,
    Rule,
    Scalar,
    Strict,
    any_when,
)
from fsdp_matrix.shipped import cases_root
from fsdp_matrix.yamlsafe import load_yaml, one_line

RAISE = " (split the case, or set FSDP_MATRIX_MAX_CELLS to raise it)"
DEFAULT_MATRIX = cases_root() / "matrix.yaml"
"""The repo's matrix.yaml, or an installed wheel's copy (fsdp_matrix/shipped.py)."""


class Pins(Strict):
    """Exact versions of the five packages under test, and of the optional ones the combo installs."""

    torch: str
    peft: str
    transformers: str
    accelerate: str
    bitsandbytes: str
    trl: Optional[str] = None
    """TRL of the combo's era (optional: a combo without it skips the ``entry: trl`` cells, platform skip
    ``trl-not-pinned``)."""

    @field_validator("*")
    @classmethod
    def _exact(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        try:
            Version(value)
        except InvalidVersion:
            raise ValueError(f"not an exact version: {value!r}") from None
        return value

    def model_dump(self, **kwargs: Any) -> Dict[str, Any]:
        """``{package: version}`` of what the combo installs: an optional package it does not pin is left out."""
        kwargs.setdefault("exclude_none", True)
        return super().model_dump(**kwargs)


def _pep508(value: str) -> str:
    if value.lstrip().startswith("-"):
        raise ValueError(f"{value!r} starts with '-': the installer would read it as an option; give a requirement")
    try:
        Requirement508(value)
    except InvalidRequirement:
        raise ValueError(f"{value!r} is not a PEP 508 requirement (e.g. 'numpy<2')") from None
    return value


def _source(value: str) -> str:
    # a git URL (git+https://host/pkg@main, git+file:///clone@REF) or a path; checked against its package above
    if not value.strip() or value.lstrip().startswith("-") or any(c < " " or c == "\x7f" for c in value):
        # a control character (a NUL, a newline) is no URL or path, and git or the OS refuses it later, mid-run
        raise ValueError(f"{value!r}: expected a git URL or path, e.g. git+https://github.com/huggingface/peft@main")
    return value


def _python_version(value: str) -> str:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+){1,2}", value):
        raise ValueError(f"{value!r} is not a Python version (e.g. '3.11')")
    return value


def _inside_repo(value: str) -> str:
    # where it leads ('..', an absolute path, a link) is checked once the file is known (load_matrix): a test matrix
    # in another folder may name the repo's repros by an absolute path or by '..'
    if not value.strip() or "\\" in value or value.startswith("~") or "\x00" in value:
        raise ValueError(f"{value!r}: a repro is a path relative to matrix.yaml, inside the repo")
    return value


class Combo(Strict):
    """One pinned version combination: one nox session, one env."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    pins: Pins
    extra: List[Annotated[str, AfterValidator(_pep508)]] = []
    """Extra requirement strings the era needs, e.g. ``numpy<2`` (PEP 508; never an option for the installer)."""
    tags: List[str] = []
    """Session tags: ``cpu``, ``gpu``, ``nightly``, ``tests``, ``mixed``..."""
    python: Optional[Annotated[str, AfterValidator(_python_version)]] = None
    """Python version for the env, e.g. ``3.11``; None means the interpreter running nox."""
    notes: str = ""
    allow_cuda_build: bool = False
    """A CPU run may install the CUDA build of torch when no CPU build of the pin is reachable through the user's
    pip/uv configuration (about 3 GB, announced with its size before the download). The torch axis needs it: only
    torch 2.13.0 has a local CPU build here. The default ``cpu`` combos leave it off and refuse a CUDA torch."""
    cases: List[str] = []
    """When given, only these cases run on this combo: a combo that pairs versions for one report (e.g. accelerate
    1.12 with torch 2.6 for accelerate#3923), whose other cells no one observed there. Empty: every case."""
    floating: Union[bool, Literal["main"]] = False
    """The pins are a last known resolution, not what runs. ``true``: at run time every package resolves to its
    newest release on the configured indexes (``nox -s newest``). ``main``: the packages in ``sources`` are built
    from their default branches, resolved to commits at run time, and the others float to their newest releases
    (``nox -s main``). Either way the records hold what was installed (``versions``, ``sources``)."""
    sources: Dict[str, Annotated[str, AfterValidator(_source)]] = {}
    """Package -> a PEP 508 direct reference to build it from instead of its pin, e.g.
    ``git+https://github.com/huggingface/peft@main`` (see fsdp_matrix/envs/sources.py); ``--pin`` overrides it."""

    @field_validator("id")
    @classmethod
    def _not_installed(cls, value: str) -> str:
        from fsdp_matrix.installed import INSTALLED

        if value == INSTALLED:  # records of either would be filed under the other's id
            raise ValueError(
                f"{INSTALLED!r} is the combo of the caller's own env (run --env installed): pick another id"
            )
        return value

    @model_validator(mode="after")
    def _sources_fit(self) -> Combo:
        from fsdp_matrix.rules import REFUSED

        for name in self.sources:
            if canonicalize_name(name) in REFUSED:
                why = REFUSED[canonicalize_name(name)]
                raise ValueError(f"sources.{name}: {name} from source is refused ({why}); pin a release")
        if self.floating == "main" and not self.sources:
            raise ValueError("floating: main needs sources (the packages built from their default branches)")
        return self

    @property
    def session(self) -> str:
        """The nox session that runs this combo (``noxfile.py``): ``main``, ``newest``, ``torch`` or ``matrix``."""
        if self.floating == "main":
            return "main"
        return "newest" if self.floating else ("torch" if "torch" in self.tags else "matrix")

    def requirements(self) -> List[str]:
        return [f"{name}=={version}" for name, version in self.pins.model_dump().items()] + list(self.extra)

    def with_pins(self, **versions: str) -> Combo:
        """The same combo with some pins replaced (a floating combo resolved, an upgrade's target)."""
        return self.model_copy(update={"pins": Pins(**{**self.pins.model_dump(), **versions})})


def derived_rule_id(rule: Dict[str, Any]) -> str:
    """The id of a rule written without one: its outcome and a digest of everything but ``id`` and ``source``
    (``error-1f0c2a9e``), so the same rule gets the same id in every run and at any place in its case, and a reworded
    citation keeps it. An explicit id is never replaced: ids are a public contract (explain, evidence sections)."""
    body = {k: v for k, v in rule.items() if k not in ("id", "source")}
    when = body.get("when") or {}
    if isinstance(when, dict):  # a when's list of values is a set: its order is not the rule's identity
        body["when"] = {k: sorted(map(str, v)) if isinstance(v, list) else v for k, v in when.items()}
    outcome = next((k for k in ("ok", "error", "skip", "hang", "warning") if k in rule), "rule")
    digest = hashlib.sha1(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{outcome}-{digest}"


class Case(Strict):
    """A reported failure: its grids of cells, what they need, and the expected outcome per version range."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    report: str
    """Where the failure was reported (seed report, upstream issue)."""
    repro: Annotated[str, AfterValidator(_inside_repo)]
    """Path of the standalone repro script, relative to the repo root (and inside it)."""
    grids: List[Dict[str, Annotated[List[Scalar], Field(min_length=1)]]] = Field(min_length=1)
    """Each grid is a product of axes; the case's cells are the union of its grids. An empty axis is refused: it
    would silently drop every cell of its grid."""
    requires: List[Requirement] = []
    """What a cell needs from the machine: rules with ``skip`` and ``device``/``min_world_size``."""
    expect: List[ExpectRule] = Field(min_length=1)
    """Rules in order; the first that matches a cell gives its expected outcome (after the platform's skips)."""
    axes: Dict[str, Axis] = {}
    """Axes of this case only (a user's case has its own knobs), declared like the top-level ``axes:``."""
    _platform: Platform = PrivateAttr(default_factory=Platform)

    @model_validator(mode="before")
    @classmethod
    def _derive_rule_ids(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("expect"), list):
            rules = data["expect"]
            named = [{**r, "id": derived_rule_id(r)} if isinstance(r, dict) and "id" not in r else r for r in rules]
            data = {**data, "expect": named}
        return data

    @model_validator(mode="after")
    def _unique_rule_ids(self) -> Case:
        seen: Dict[str, int] = {}
        for i, rule in enumerate(self.expect):
            if rule.id is not None and seen.setdefault(rule.id, i) != i:
                raise ValueError(f"expect[{i}].id: duplicate rule id {rule.id!r} (expect[{seen[rule.id]}] has it)")
        return self

    def rule_id(self, index: int) -> str:
        """``<case>/<rule id>`` of ``expect[index]`` (``<case>/expect[index]`` for a rule without an id)."""
        return f"{self.id}/{self.expect[index].id or f'expect[{index}]'}"

    @property
    def platform(self) -> Platform:
        """The matrix's platform rules: the Matrix that holds this case hands them over, so that every caller of
        ``expected_for(case, ...)`` gets them without passing the matrix around."""
        return self._platform

    def grid_axes(self) -> Dict[str, List[Scalar]]:
        """Every axis of the case's grids with every value it takes."""
        out: Dict[str, List[Scalar]] = {}
        for grid in self.grids:
            for name, values in grid.items():
                out.setdefault(name, []).extend(v for v in values if not any(same_value(v, o) for o in out[name]))
        return out

    def check_when(self) -> None:
        """A ``when`` naming an axis or a value that no cell has would never match: a dead rule, silently. Checked by
        the Matrix, after the grids are checked against the declared axes (a typo in a grid is named there)."""
        axes = self.grid_axes()
        named = [(f"expect[{i}].when", rule) for i, rule in enumerate(self.expect)]
        named += [(f"requires[{i}].when", req) for i, req in enumerate(self.requires)]
        for where, rule in named:
            for key, want in (item for when in rule.alternatives() for item in when.items()):
                if key not in axes and key not in BUILTIN_AXES:
                    have = ", ".join(sorted(axes) + list(BUILTIN_AXES))
                    raise ValueError(f"{where}.{key}: unknown axis {key!r} (this case has: {have})")
                values = axes.get(key, BUILTIN_AXES.get(key))
                for value in want if isinstance(want, list) else [want]:
                    if not allowed(value, values):
                        raise ValueError(f"{where}.{key}: unknown value {value!r} (the axis has: {shown(values)})")


def _named_error(value: Any, errors: Dict[str, Any], where: str) -> Any:
    """An ``error`` given by name: the signature ``errors:`` declares under it (an inline mapping is kept as is)."""
    if not isinstance(value, str):
        return value
    if value not in errors:
        have = ", ".join(sorted(errors)) or "none declared"
        raise ValueError(f"{where}: unknown error {value!r} (errors: has {have})")
    return errors[value]


def resolve_named_errors(data: Any) -> Any:
    """``data`` with every error named by a string (a case rule's ``error``, an item of a platform signature's
    ``errors``) replaced by its signature from the top-level ``errors:`` table, so that the rule models see only
    signatures."""
    if not isinstance(data, dict) or not isinstance(data.get("errors", {}), dict):
        return data
    table = data.get("errors") or {}
    data = dict(data)
    if isinstance(data.get("cases"), list):  # anything else is the model's to refuse, in one line
        cases = []
        for i, case in enumerate(data["cases"]):
            if isinstance(case, dict) and isinstance(case.get("expect"), list):
                rules = []
                for j, rule in enumerate(case["expect"]):
                    if isinstance(rule, dict) and "error" in rule:
                        where = f"cases[{i}]({case.get('id')}).expect[{j}].error"
                        rule = {**rule, "error": _named_error(rule["error"], table, where)}
                    rules.append(rule)
                case = {**case, "expect": rules}
            cases.append(case)
        data["cases"] = cases
    platform = data.get("platform")
    if isinstance(platform, dict) and isinstance(platform.get("signatures"), list):
        sigs = []
        for k, sig in enumerate(platform["signatures"]):
            if isinstance(sig, dict) and isinstance(sig.get("errors"), list):
                where = f"platform.signatures[{k}]({sig.get('id')}).errors"
                sig = {**sig, "errors": [_named_error(e, table, f"{where}[{n}]") for n, e in enumerate(sig["errors"])]}
            sigs.append(sig)
        data["platform"] = {**platform, "signatures": sigs}
    return data


class Matrix(Strict):
    """The whole of matrix.yaml."""

    errors: Dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")], ErrorSignature] = {}
    """Error signatures that several rules share, by name: a case rule's ``error:`` and an item of a platform
    signature's ``errors:`` may give the name instead of the mapping (one regex, written once)."""
    axes: Optional[Dict[str, Axis]] = None
    """The shared axes: name -> meaning and allowed values. When given, every grid axis must be declared here or
    in its case's ``axes:``, and every grid and ``when`` value must be one of the declared values."""
    platform: Platform = Platform()
    """Rules every case shares (see fsdp_matrix.rules)."""
    combos: List[Combo] = Field(min_length=1)
    cases: List[Case] = Field(min_length=1)

    _origin: Optional[Path] = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _resolve_errors(cls, data: Any) -> Any:
        return resolve_named_errors(data)

    @property
    def evidence_dir(self) -> Optional[Path]:
        """``docs/pages/evidence`` beside the matrix file it was loaded from (None for a matrix parsed from data)."""
        return None if self._origin is None else self._origin.parent / "docs" / "pages" / "evidence"

    @model_validator(mode="after")
    def _declared_axes(self) -> Matrix:
        # counted before anything expands a grid: a 10^9-cell grid must be one line, not a MemoryError
        limit, total = max_cells(), 0
        for i, case in enumerate(self.cases):
            cells = check_grids(case.id, i, case.grids)
            if cells > limit:
                raise ValueError(
                    f"cases[{i}]({case.id}).grids: {cells} cells per device and world size; limit {limit}{RAISE}"
                )
            total += cells
        if total > limit:
            raise ValueError(f"cases: {total} cells per device and world size in all; limit {limit}{RAISE}")
        if self.axes is not None:
            for name, axis in [*self.axes.items(), *((n, a) for c in self.cases for n, a in c.axes.items())]:
                problem = name_problem(name) or next(filter(None, map(value_problem, axis.values)), None)
                if problem:
                    raise ValueError(f"axes.{name}: {problem}")
        self._check_grid_axes()
        for i, case in enumerate(self.cases):
            try:
                case.check_when()
            except ValueError as exc:
                raise ValueError(f"cases[{i}]({case.id}).{exc}") from None
        self._check_platform_axes()
        return self

    def _check_grid_axes(self) -> None:
        if self.axes is None:
            return
        for i, case in enumerate(self.cases):
            declared = {**self.axes, **case.axes}
            for j, grid in enumerate(case.grids):
                for name, values in grid.items():
                    where = f"cases[{i}]({case.id}).grids[{j}].{name}"
                    if name in LAYOUT_AXES:
                        continue  # checked by check_grids: a launch layout, not a declared axis
                    if name not in declared:
                        raise ValueError(
                            f"{where}: axis {name!r} is not declared (add it to axes: or the case's axes:)"
                        )
                    for value in values:
                        if not allowed(value, declared[name].values):
                            have = shown(declared[name].values)
                            raise ValueError(f"{where}: unknown value {value!r} (axes.{name} has: {have})")

    def _check_platform_axes(self) -> None:
        """A platform ``when`` names declared axes and values (or, with no ``axes:``, those some grid has)."""
        if self.axes is not None:
            known: Dict[str, Any] = {name: axis.values for name, axis in self.axes.items()}
        else:
            known = {}
            for case in self.cases:
                for name, values in case.grid_axes().items():
                    known.setdefault(name, []).extend(values)
        known.update(BUILTIN_AXES)
        for kind, rules in (("skips", self.platform.skips), ("signatures", self.platform.signatures)):
            for k, rule in enumerate(rules):
                for when in rule.alternatives():
                    for key, want in when.items():
                        where = f"platform.{kind}[{k}]({rule.id}).when.{key}"
                        if key not in known:
                            raise ValueError(f"{where}: unknown axis {key!r} (have: {', '.join(sorted(known))})")
                        for value in want if isinstance(want, list) else [want]:
                            if not allowed(value, known[key]):
                                raise ValueError(
                                    f"{where}: unknown value {value!r} (the axis has: {shown(known[key])})"
                                )

    @model_validator(mode="after")
    def _combo_cases_exist(self) -> Matrix:
        known = {case.id for case in self.cases}
        for i, combo in enumerate(self.combos):
            for case_id in combo.cases:
                if case_id not in known:
                    raise ValueError(f"combos[{i}]({combo.id}).cases: unknown case {case_id!r}")
        return self

    @model_validator(mode="after")
    def _hand_platform_to_cases(self) -> Matrix:
        for case in self.cases:
            case._platform = self.platform
        return self

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
    return out


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
        where = _loc(loc, data)
        raise MatrixConfigError(one_line(f"{origin}: {where + ': ' if where else ''}{msg}{more}")) from None


def load_matrix(path: Union[str, Path, None] = None, check_repros: bool = True) -> Matrix:
    """Parse and validate a matrix.yaml. ``check_repros``: every case's repro file must exist, relative to the
    file's folder (the report, which only orders its rows by the matrix, does without)."""
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        text = path.read_text()
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a NUL in the path
        raise MatrixConfigError(one_line(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")) from None
    data = load_yaml(path, text)
    matrix = parse_matrix(data, origin=path.name)
    matrix._origin = path
    if check_repros:
        roots = {path.parent.resolve(), DEFAULT_MATRIX.parent.resolve()}
        for i, case in enumerate(matrix.cases):
            repro = (path.parent / case.repro).resolve()
            if not any(repro.is_relative_to(root) for root in roots):
                where = " or ".join(sorted(map(str, roots)))
                raise MatrixConfigError(
                    one_line(f"{path.name}: cases[{i}]({case.id}).repro: {case.repro} resolves outside {where}")
                )
            if not (path.parent / case.repro).is_file():
                raise MatrixConfigError(
                    one_line(
                        f"{path.name}: cases[{i}]({case.id}).repro: {case.repro}: no such file "
                        f"(relative to {path.parent})"
                    )
                )
    return matrix
