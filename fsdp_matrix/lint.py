"""What ``validate`` reports beyond a malformed file: rules that can never decide a cell, and case rules that
copy a platform rule.

A rule is dead when

- its ``when`` selects no cell of its case (each value exists, but no cell has them together), or
- every cell it selects is already decided by an earlier rule for every env it names (an earlier rule, or a platform
  skip, whose ``when`` holds for the cell and whose ``versions`` ask no more), or
- on no combo of the matrix does it decide a cell, though on some its ``when`` and ``versions`` hold: an earlier
  rule always wins there. (A rule whose versions no combo has is not reported: it may be written for a release the
  matrix does not pin, like merge-device's ``peft==0.13.0``.)

A rule whose ``versions`` admit no release at all (``>=0.14,<0.13``) is reported too: the specifier is tried on
every boundary version it names and its neighbours.

A case rule duplicates a platform rule when it expects the error of a platform signature (the case's rule would win
and call it reproduced), or when a platform skip already selects every cell it selects for the same versions.

The evidence files (``docs/pages/evidence/*.md``, fsdp_matrix.evidence) are checked against the rules: a section whose
heading names no rule, or that sits in another case's file, is reported, and so is a case named ``platform`` (the
platform's evidence file). A rule without a section is not: its one-line ``source`` may say all there is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from fsdp_matrix.cells import Cell, expand_case
from fsdp_matrix.evidence import PLATFORM, problems, read_all
from fsdp_matrix.expectations import trace
from fsdp_matrix.match import matches
from fsdp_matrix.matrix import Case, Matrix


@dataclass(frozen=True)
class Finding:
    """One rule ``validate`` reports."""

    where: str
    """``cases[3](mixed-dtype).expect[2]`` or ``platform.skips[0](fsdp2-no-cpu)``."""
    message: str
    """What is wrong with it, naming the rule that shadows or duplicates it."""

    def line(self) -> str:
        return f"{self.where}: {self.message}"


def _cells(case: Case) -> List[Cell]:
    return [c for device in ("cpu", "cuda") for ws in (1, 2) for c in expand_case(case, device, ws)]


def _asks_no_more(earlier: Mapping[str, str], later: Mapping[str, str]) -> bool:
    """Every env ``later`` names is one ``earlier`` holds for: ``earlier`` asks nothing ``later`` does not ask."""
    return all(later.get(pkg) == spec for pkg, spec in earlier.items())


def _neighbours(version: Version) -> List[Version]:
    """``version`` and the releases just above and below it at each level (1.2.3 -> 1.2.4, 1.3.0, 2.0.0, 1.2.2,
    1.1.999, 0.999.999): enough to find a release inside any interval whose ends are written as versions."""
    rel = list(version.release) + [0] * (3 - len(version.release))
    out = [version]
    for i in range(3):
        out.append(Version(".".join(map(str, rel[:i] + [rel[i] + 1] + [0] * (2 - i)))))
        if rel[i] > 0:
            out.append(Version(".".join(map(str, rel[:i] + [rel[i] - 1] + [999] * (2 - i)))))
    return out


def empty_specifier(spec: str) -> bool:
    """True when no release can satisfy ``spec``."""
    specs = SpecifierSet(spec)
    candidates = [Version("0"), Version("999")]
    for one in specs:
        try:
            candidates += _neighbours(Version(one.version.rstrip(".*")))
        except InvalidVersion:
            return False  # an arbitrary-equality string: leave it alone
    return not any(specs.contains(c, prereleases=True) for c in candidates)


def _empty_versions(where: str, versions: Mapping[str, str]) -> List[Finding]:
    return [
        Finding(f"{where}.versions.{pkg}", f"{spec!r} admits no release: the rule can never match")
        for pkg, spec in versions.items()
        if empty_specifier(spec)
    ]


def lint(matrix: Matrix) -> List[Finding]:
    out: List[Finding] = []
    platform = matrix.platform
    for kind, rules in (("skips", platform.skips), ("signatures", platform.signatures)):
        for k, rule in enumerate(rules):
            out += _empty_versions(f"platform.{kind}[{k}]({rule.id})", rule.versions)
    for i, case in enumerate(matrix.cases):
        for r, rule in enumerate(case.expect):
            out += _empty_versions(f"cases[{i}]({case.id}).expect[{r}]", rule.versions)
    all_cells = {case.id: _cells(case) for case in matrix.cases}
    for kind, rules in (("skips", platform.skips), ("signatures", platform.signatures)):
        for k, rule in enumerate(rules):
            for a, when in enumerate(rule.alternatives()):
                if not any(matches(when, c.context()) for cells in all_cells.values() for c in cells):
                    alt = f".when[{a}]" if isinstance(rule.when, list) else ".when"
                    out.append(Finding(f"platform.{kind}[{k}]({rule.id}){alt}", "selects no cell of any case"))
    out += evidence_findings(matrix)
    decided = _decided(matrix)
    for i, case in enumerate(matrix.cases):
        cells = all_cells[case.id]
        for r, rule in enumerate(case.expect):
            where = f"cases[{i}]({case.id}).expect[{r}]"
            chosen = [c for c in cells if any(matches(w, c.context()) for w in rule.alternatives())]
            if not chosen:
                out.append(Finding(where, f"when {rule.when} selects no cell of the case"))
                continue
            for s, sig in enumerate(platform.signatures):
                if rule.error and any(e.type == rule.error.type and e.match == rule.error.match for e in sig.errors):
                    out.append(Finding(where, f"duplicates platform.signatures[{s}]({sig.id}); delete it"))
            # a skip for envs that lack a package never decides the envs that have it, which the case's rules are for
            earlier = [
                (f"platform.skips[{s}]({p.id})", p.alternatives(), p.versions)
                for s, p in enumerate(platform.skips)
                if not p.absent
            ]
            earlier += [(f"expect[{e}]", x.alternatives(), x.versions) for e, x in enumerate(case.expect[:r])]
            shadow = _shadowing(chosen, rule.versions, earlier)
            if shadow:
                what = "duplicates" if shadow.startswith("platform") and rule.skip is not None else "is shadowed by"
                out.append(Finding(where, f"{what} {shadow}: it selects every cell of this rule first; delete one"))
                continue
            wins, holds = decided.get((case.id, r), (0, 0))
            if holds and not wins:
                out.append(
                    Finding(
                        where,
                        f"never decides a cell on any combo: where it holds ({holds} cell(s)), an earlier rule wins",
                    )
                )
    return out


def evidence_findings(matrix: Matrix) -> List[Finding]:
    """Evidence sections that belong to no rule (or to another file), and a case that takes the platform's name."""
    out = [
        Finding(f"cases[{i}]", f"the case id {PLATFORM!r} is the platform's evidence file; rename the case")
        for i, case in enumerate(matrix.cases)
        if case.id == PLATFORM
    ]
    ids = {case.rule_id(r) for case in matrix.cases for r in range(len(case.expect))}
    ids |= {f"{PLATFORM}/{rule.id}" for rule in [*matrix.platform.skips, *matrix.platform.signatures]}
    return out + [Finding(where, what) for where, what in problems(read_all(matrix.evidence_dir), ids)]


def _shadowing(cells: List[Cell], versions: Mapping[str, str], earlier: List[Tuple]) -> str:
    """The first earlier rule that decides every one of ``cells`` before this one, for every env this one names."""
    for name, whens, specs in earlier:
        if _asks_no_more(specs, versions) and all(any(matches(w, c.context()) for w in whens) for c in cells):
            return name
    return ""


def _decided(matrix: Matrix) -> Dict[Tuple[str, int], Tuple[int, int]]:
    """(case, rule index) -> (cells it decides, cells where it holds) over every combo of the matrix on its pins."""
    counts: Dict[Tuple[str, int], List[int]] = {}
    for combo in matrix.combos:
        device = "cuda" if "gpu" in combo.tags else "cpu"
        versions = combo.pins.model_dump()
        for case in matrix.cases:
            for ws in (1, 2):
                for cell in expand_case(case, device, ws):
                    for t in trace(case, cell, versions).trials:
                        if t.stage == "case rule" and t.matched:
                            n = counts.setdefault((case.id, int(t.name[7:-1])), [0, 0])
                            n[1] += 1
                            n[0] += t.decides
    return {k: (v[0], v[1]) for k, v in counts.items()}
