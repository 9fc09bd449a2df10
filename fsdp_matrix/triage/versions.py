"""What the matrix knows for the user's versions: whether they are inside the range its combos observed, where the
matched rule stops reproducing ("fixed in"), and the configuration changes that train instead (the matched rule's own
cells with one of its ``when`` keys changed, filtered by the platform rules of the user's release).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from fsdp_matrix.cells import Cell, expand_case
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.match import any_when, matches, version_matches
from fsdp_matrix.matrix import Case, Combo, Matrix

IDENTITY_KEYS = ("adapter", "model", "entry")
"""Cell axes a workaround keeps as the user has them: what is trained, on what model, through which entry."""


def _version(text: Optional[str]) -> Optional[Version]:
    """The release without its local label (``2.4.1+cu121`` -> ``2.4.1``); None for none or a git ref."""
    try:
        return Version(Version(text).public) if text else None
    except InvalidVersion:
        return None


def observed_range(matrix: Matrix, versions: Mapping[str, Optional[str]]) -> List[str]:
    """One line per given version older or newer than every combo's pin of that package."""
    out = []
    for package, mine in versions.items():
        have = _version(mine)
        pins = [v for v in (_version(getattr(c.pins, package, None)) for c in matrix.combos) if v]
        if have is None or not pins:
            continue
        if have < min(pins) and have.release[:2] == min(pins).release[:2]:
            # a patch release below the oldest combo's: same minor, judged as that release (not "unknown")
            out.append(
                f"{package} {mine} is an earlier patch of the oldest combo's {package} {min(pins)}; "
                "what is shown is known for that release"
            )
        elif have < min(pins):
            out.append(
                f"{package} {mine} is older than every combo observed (oldest: {package} {min(pins)}); "
                "nothing here is known for it"
            )
        elif have.release[:2] > max(pins).release[:2]:
            out.append(
                f"{package} {mine} is newer than every combo observed (newest: {package} {max(pins)}); "
                "what is shown is known up to that release only"
            )
    return out


def older_than_observed(lines: List[str]) -> bool:
    return any("older than every combo" in line for line in lines)


@dataclass
class Fixed:
    """Where the matched rule stops: its own upper bound, or the first combo whose same cells train."""

    text: str
    """``peft >=0.14 (the rule's own bound: it reproduces on peft <0.14)`` or ``no release ...``."""
    versions: Dict[str, str] = field(default_factory=dict)
    """Package -> the first version named as fixed (empty when none is)."""


def _upper_bounds(spec: str) -> List[Tuple[str, str]]:
    """(operator, version) of the specifier's upper bounds: ``<0.14``, ``<=0.13.0``, ``==0.13.0``."""
    return [(s.operator, s.version) for s in SpecifierSet(spec) if s.operator in ("<", "<=", "==")]


def _order(combo: Combo, packages: List[str]) -> Tuple:
    return tuple(_version(getattr(combo.pins, p, None)) or Version("0") for p in packages)


def _rule_cells(case: Case, rule: Any) -> List[Cell]:
    whens = any_when(getattr(rule, "when", None) or {})
    return [c for c in expand_case(case) if any(matches(w, c.context()) for w in whens)]


def _first_training_combo(matrix: Matrix, case: Case, index: int) -> Optional[Combo]:
    """The lowest combo past the rule's range on which one of the rule's cells is expected to train."""
    rule = case.expect[index]
    specs = dict(getattr(rule, "versions", None) or {})
    cells = _rule_cells(case, rule)
    for combo in sorted(matrix.combos, key=lambda c: _order(c, list(specs))):
        pins = combo.pins.model_dump()
        if not all(_past(spec, pins.get(p)) for p, spec in specs.items()):
            continue
        if any(expected_for(case, cell, pins).kind == "ok" for cell in cells):
            return combo
    return None


def _past(spec: str, version: Optional[str]) -> bool:
    """The version is above the specifier's upper bound (not merely outside its range)."""
    have = _version(version)
    bounds = _upper_bounds(spec)
    if have is None or not bounds or version_matches(spec, version):
        return False
    return all(have > Version(v) or (op == "<" and have == Version(v)) for op, v in bounds)


def fixed_in(matrix: Matrix, case: Case, index: int) -> Fixed:
    """Where the rule ``case.expect[index]`` stops reproducing, never inside its own range."""
    rule = case.expect[index]
    specs = dict(getattr(rule, "versions", None) or {})
    bounds = {p: [(op, v) for op, v in _upper_bounds(s) if op == "<"] for p, s in specs.items()}
    named = {p: b[0][1] for p, b in bounds.items() if b}
    if named:
        since = " or ".join(f"{p} >={v}" for p, v in named.items())
        within = ", ".join(f"{p} {s}" for p, s in specs.items())
        return Fixed(f"{since} (the rule's own bound: it reproduces on {within})", named)
    combo = _first_training_combo(matrix, case, index) if specs else None
    if combo is not None:
        pins = combo.pins.model_dump()
        found = {p: pins[p] for p in specs if pins.get(p)}
        return Fixed(
            f"{', '.join(f'{p} {v}' for p, v in found.items())} (combo {combo.id}: the same cells train)", found
        )
    held = ", ".join(f"{p} {s}" for p, s in specs.items()) or "every version"
    return Fixed(f"no release in matrix.yaml fixes it (the rule holds on {held})")


@dataclass
class Workaround:
    """An ``ok`` rule whose cells are the matched rule's cells with one setting changed."""

    rule: int
    """Index of the ``ok`` rule in the case's ``expect``."""
    change: str
    """The setting changed, e.g. ``storage=bf16``."""
    cells: List[str]
    """Cell ids expected to train with that change."""
    together: List[str] = field(default_factory=list)
    """Other settings (``autocast=0``) those cells share, without which the change alone reaches a cell that does not
    train: the change is named with them. Empty when the change alone trains wherever it reaches."""

    @property
    def key(self) -> str:
        """The setting's name (``storage``)."""
        return self.change.split("=", 1)[0]


def _change(rule_when: Mapping[str, Any], cell: Cell) -> Optional[str]:
    """The one ``when`` key the cell has otherwise (``key=value``), or None when it differs in none or several."""
    ctx = cell.context()
    present = [k for k in rule_when if k in ctx]
    differ = [k for k in present if not matches({k: rule_when[k]}, ctx)]
    kept = all(k in ctx and matches({k: rule_when[k]}, ctx) for k in IDENTITY_KEYS if k in rule_when)
    return f"{differ[0]}={ctx[differ[0]]}" if len(differ) == 1 and kept else None


def _missing_options(matrix: Matrix, versions: Mapping[str, Optional[str]]) -> List[str]:
    """The cell axes a platform skip says the user's release lacks (``autocast`` on peft <0.12)."""
    platform = getattr(matrix, "platform", None)
    out: List[str] = []
    for rule in getattr(platform, "skips", None) or []:
        specs = getattr(rule, "versions", None) or {}
        if specs and all(version_matches(s, versions.get(p)) for p, s in specs.items()):
            when = getattr(rule, "when", None) or {}
            for one in when if isinstance(when, list) else [when]:
                out += list(one.keys())
    return out


def lacking_options(matrix: Matrix, versions: Mapping[str, Optional[str]]) -> set:
    """The settings the user's release lacks (a platform skip's ``when`` keys), hardware keys aside."""
    return set(_missing_options(matrix, versions)) - set(HARDWARE_KEYS)


def workarounds(
    matrix: Matrix, case: Case, index: int, versions: Mapping[str, Optional[str]], device: str = "cpu"
) -> List[Workaround]:
    """The matched rule's cells on ``device`` with one of its ``when`` settings changed that train on these versions,
    by the ``ok`` rule that says so; a setting the user's release lacks (a platform skip) is left out. ``check`` asks
    for the setup's own device: on CPU a platform skip (no 4-bit on CPU before transformers 4.56) hides what the
    rules say of a GPU."""
    whens = any_when(getattr(case.expect[index], "when", None) or {})
    lacking = set(_missing_options(matrix, versions)) - {"device", "world_size", "nodes"}
    found: Dict[Tuple[int, str], List[Cell]] = {}
    failing: Dict[str, List[Cell]] = {}
    for cell in expand_case(case, device):
        change = next((c for w in whens if (c := _change(w, cell))), None)
        if change is None or change.split("=", 1)[0] in lacking:
            continue
        expected = expected_for(case, cell, versions)
        if expected.kind == "ok" and expected.rule is not None:
            found.setdefault((expected.rule, change), []).append(cell)
        elif expected.kind not in ("skip", "none"):
            failing.setdefault(change, []).append(cell)
    return [
        Workaround(r, change, sorted(c.id for c in cells), _together(change, cells, failing.get(change, [])))
        for (r, change), cells in sorted(found.items(), key=lambda kv: -len(kv[1]))
    ]


def _together(change: str, trains: List[Cell], fails: List[Cell]) -> List[str]:
    """The fewest settings, shared by every cell that trains with the change, that no cell which still fails with it
    has (greedily, the one that rules out most first): ``storage=bf16`` trains with ``autocast=0``, and meets the
    uniform-dtype error with ``autocast=1``. Empty when no cell fails with the change."""
    key = change.split("=", 1)[0]
    shared = {k: v for k, v in trains[0].context().items() if k != key}
    shared = {k: v for k, v in shared.items() if all(c.context().get(k) == v for c in trains)}
    left, out = [c.context() for c in fails], []
    while left and shared:
        best = max(shared, key=lambda k: sum(ctx.get(k) != shared[k] for ctx in left))
        if not any(ctx.get(best) != shared[best] for ctx in left):
            break  # nothing the trained cells share tells the failing ones apart
        out.append(f"{best}={shared.pop(best)}")
        left = [ctx for ctx in left if _same(ctx, out)]
    return out


def _same(ctx: Mapping[str, Any], settings: List[str]) -> bool:
    """Whether a cell's settings hold every ``key=value`` of ``settings``."""
    return all(str(ctx.get(k)) == v for k, v in (s.split("=", 1) for s in settings))


HARDWARE_KEYS = ("device", "world_size", "nodes")
"""Platform-skip keys of the machine that runs the matrix (a CPU), not of the user's run."""


def _skips_every_cell(skip_when: Mapping[str, Any], rule_whens: List[Dict[str, Any]]) -> bool:
    """Every cell of one of the rule's ``when`` alternatives has the skip's settings (hardware keys aside)."""
    keys = [k for k in skip_when if k not in HARDWARE_KEYS]
    if not keys:
        return False
    for when in rule_whens:
        values = {k: when[k] if isinstance(when[k], list) else [when[k]] for k in keys if k in when}
        if len(values) == len(keys) and all(matches({k: skip_when[k]}, {k: v}) for k in keys for v in values[k]):
            return True
    return False


def cannot_raise(matrix: Matrix, rule: Any, versions: Mapping[str, Optional[str]]) -> Optional[str]:
    """Why the rule cannot be the failure on the versions a paste states: a stated version outside its range, or a
    setting its cells need that the stated release lacks (a platform skip: no ``autocast_adapter_dtype`` before PEFT
    0.12); None when nothing stated rules it out (a version not stated rules nothing out)."""
    for package, spec in (getattr(rule, "versions", None) or {}).items():
        if versions.get(package) and not version_matches(spec, versions[package]):
            return f"it reproduces on {package} {spec}, the paste states {package} {versions[package]}"
    rule_whens = any_when(getattr(rule, "when", None) or {})
    for skip in getattr(getattr(matrix, "platform", None), "skips", None) or []:
        specs = getattr(skip, "versions", None) or {}
        if not specs or not all(versions.get(p) and version_matches(s, versions[p]) for p, s in specs.items()):
            continue
        if any(_skips_every_cell(w, rule_whens) for w in any_when(getattr(skip, "when", None) or {})):
            stated = ", ".join(f"{p} {versions[p]}" for p in specs)
            return f"its cells need a setting {stated} lacks ({skip.id})"
    return None


def fails_on(case: Case, cell_ids: List[str], versions: Mapping[str, Optional[str]], device: str = "cpu") -> bool:
    """Whether a rule of the case expects one of these cells to fail (an error, a hang, a check) on these versions:
    a setting that trains on another combo but is known to fail on the user's own is not what works there."""
    wanted = set(cell_ids)
    cells = [c for c in expand_case(case, device) if c.id in wanted]
    return any(expected_for(case, cell, versions).kind not in ("ok", "skip", "none") for cell in cells)
