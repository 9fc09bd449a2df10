"""``python -m fsdp_matrix upgrade NAME==VERSION ... [--combo ID] [--cases IDS] [--json PATH]``: which cells a version
bump changes, and for each the first release that changed it.

The base is a combo (default: the newest ``cpu`` one); the target is the base with the bumped pins. Every cell runs
on both (an env and its records are reused when already there). For the cells whose verdict changed, each bumped
package's releases between base and target are bisected with ``bisect_cells``: one install per candidate, every
changed cell in one launch, the ends known from the base and target runs. With several bumped packages, each cell
is first pinned on one of them: the others held at the base (bump one alone), then at the target (revert one
alone); only that package is bisected, with the others where they were held.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name
from packaging.version import Version

from fsdp_matrix.bisect.installers import PinnedInstaller, parse_pins
from fsdp_matrix.bisect.paths import usable_dir, writable_file
from fsdp_matrix.bisect.releases import release_candidates
from fsdp_matrix.bisect.search import CellsRunner, Outcome, Prepared, Step, Untestable, bisect_cells
from fsdp_matrix.bisect.upgrade_git import CommitLine, commit_lines, parse_git_args, seen_at
from fsdp_matrix.cells import expand
from fsdp_matrix.envs.sources import SourcePin
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.matrix import Combo, load_matrix
from fsdp_matrix.progress import Heartbeat, fmt_seconds
from fsdp_matrix.report.style import symbol
from fsdp_matrix.runner import options
from fsdp_matrix.runner.options import CONCRETE_DEVICE
from fsdp_matrix.usage import OneLineParser, flat, positive_seconds
from fsdp_matrix.verdicts import Verdict

Pins = Dict[str, str]
Observed = Mapping[str, Any]
"""cell -> Outcome (with its verdict) or Untestable, as a CellsRunner answers."""


@dataclass
class Changed:
    """One cell whose verdict differs between base and target."""

    cell: str
    base_verdict: str
    target_verdict: str
    first_changed: Dict[str, str] = field(default_factory=dict)
    """Package -> first release at which the cell's verdict differs from the base's."""
    last_unchanged: Dict[str, str] = field(default_factory=dict)
    """Package -> the release just before it, tested and like the base."""
    answer: str = ""
    """One line per bisected package."""
    first_changed_commit: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    """Package (given with ``--git``) -> ``{sha, subject, date, pr}`` of the first commit that changed the cell."""
    last_unchanged_commit: Dict[str, str] = field(default_factory=dict)
    """Package -> full SHA of the commit just before it."""


@dataclass
class UpgradeResult:
    base: Dict[str, Any]
    """``{"combo": id, "pins": {...}}``."""
    target: Dict[str, Any]
    """``{"pins": {...}, "bumped": {name: [base version, target version]}}``."""
    changed: List[Changed] = field(default_factory=list)
    cells: int = 0
    """Cells run on both."""
    untestable: Dict[str, str] = field(default_factory=dict)
    """Cells with no verdict on base or target, and why."""
    installs: int = 0
    """Distinct envs prepared in the whole run (reused ones included)."""
    installed: int = 0
    """Of those, envs that really had to be installed."""
    install_bound: int = 0
    """ceil(log2 n) + 2 per bisected package (n: its candidate releases), plus the attribution envs."""
    launches: int = 0
    wall_s: float = 0.0
    commit_lines: List[CommitLine] = field(default_factory=list)
    """The commit searches ``--git`` asked for: one per package and release pair, with their steps and bound."""

    @property
    def regressions(self) -> List[Changed]:
        bad = Verdict.REGRESSION.value
        return [c for c in self.changed if c.target_verdict == bad and c.base_verdict != bad]

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


class _Bumped:
    """Installer of one package's candidate releases with every other package held at ``context``."""

    def __init__(self, installer: PinnedInstaller, context: Pins, package: str) -> None:
        self.installer, self.context, self.package = installer, context, package

    def prepare(self, candidate: str) -> Prepared[Path]:
        return self.installer.install({**self.context, self.package: candidate}, list(self.installer.combo.extra))


def _verdicts(observed: Observed) -> Dict[str, str]:
    return {c: o.verdict for c, o in observed.items() if isinstance(o, Outcome)}


def _same_verdict(a: Outcome, b: Outcome) -> bool:
    return a.verdict == b.verdict


def _ordered(package: str, old: str, new: str, pre: bool, candidates: Callable[..., List[str]]) -> List[str]:
    # a downgrade is bisected the other way round: index 0 is always the base
    if Version(new) >= Version(old):
        return candidates(package, old, new, pre)
    return list(reversed(candidates(package, new, old, pre)))


def run_upgrade(
    base: Combo,
    bumps: Mapping[str, str],
    cells: Sequence[str],
    installer: PinnedInstaller,
    runner: CellsRunner[Path],
    *,
    pre: bool = False,
    candidates: Optional[Callable[..., List[str]]] = None,
    beat: Optional[Heartbeat] = None,
    git: Optional[Mapping[str, SourcePin]] = None,
    cache: Optional[Path] = None,
) -> UpgradeResult:
    """The whole upgrade check; ``installer`` and ``runner`` do the real work (fakes in tests). ``git``: package ->
    its repository, whose commits between the first changed release and the one before are bisected next
    (bisect/upgrade_git.py); ``cache`` holds their snapshots (default: the installer's)."""
    start = time.monotonic()
    git = dict(git or {})
    cache = cache or getattr(installer, "cache", None)
    candidates = candidates or release_candidates
    say = beat.say if beat else print
    base_pins: Pins = base.pins.model_dump()
    bumps = {canonicalize_name(k): v for k, v in bumps.items()}
    unknown = [k for k in bumps if k not in base_pins]
    if unknown:
        raise EnvError(f"{', '.join(unknown)}: not pinned by combo {base.id} (bump one of {', '.join(base_pins)})")
    for pkg, version in bumps.items():
        if Version(version).public == Version(base_pins[pkg]).public:
            raise EnvError(f"{pkg}=={version} is already the base's pin: nothing to upgrade")
    # the target's releases are checked before anything runs on the base (a typo would cost a whole base run)
    for pkg, version in bumps.items():
        candidates(pkg, version, version, pre)
    target_pins = {**base_pins, **bumps}
    result = UpgradeResult(
        {"combo": base.id, "pins": base_pins},
        {"pins": target_pins, "bumped": {k: [base_pins[k], v] for k, v in bumps.items()}},
        cells=len(cells),
    )
    runs: Dict[Tuple[Tuple[str, str], ...], Observed] = {}

    def env_run(pins: Pins, what: str, wanted: Sequence[str]) -> Observed:
        key = tuple(sorted(pins.items()))
        have = runs.get(key, {})
        need = [c for c in wanted if c not in have]
        if need:
            if beat:
                beat.update(f"{what}: preparing the env", say=True)
            prepared = installer.install(pins, list(base.extra))
            if not prepared.ok:
                raise EnvError(f"{what}: the env cannot be prepared: {prepared.reason}")
            try:
                have = {**have, **runner.run_cells(prepared.env, what, need)}
            except Untestable as exc:
                raise EnvError(f"{what}: no cell could run: {exc}") from None
            runs[key] = have
        return have

    say(f"base {base.id}: " + ", ".join(f"{k} {v}" for k, v in base_pins.items()))
    say("target: " + ", ".join(f"{k} {base_pins[k]} -> {v}" for k, v in bumps.items()) + f"; {len(cells)} cells")
    on_base = env_run(base_pins, "base", cells)
    on_target = env_run(target_pins, "target", cells)
    before, after = _verdicts(on_base), _verdicts(on_target)
    for cell in cells:
        if cell not in before or cell not in after:
            why = on_base.get(cell) if cell not in before else on_target.get(cell)
            result.untestable[cell] = f"{'base' if cell not in before else 'target'}: {why or 'no record'}"
    changed = [c for c in cells if c in before and c in after and before[c] != after[c]]
    result.changed = [Changed(c, before[c], after[c]) for c in changed]
    say(f"{len(changed)} of {len(cells)} cells changed verdict")
    by_cell = {c.cell: c for c in result.changed}

    # which bumped package changes each cell: alone on the base, else reverted alone from the target
    groups: Dict[Tuple[str, str], List[str]] = {}
    if len(bumps) == 1 and changed:
        groups[(next(iter(bumps)), "base")] = changed
    elif changed:
        unexplained = list(changed)
        unbuilt: List[str] = []
        for context in ("base", "target"):
            for pkg in bumps:
                # on the base, one package that changes a cell alone explains it: stop once every cell has one. A
                # cell left for the target needs several bumps together, and reverting each of them tells
                if not unexplained or (
                    context == "base" and all(any(c in g for g in groups.values()) for c in unexplained)
                ):
                    break
                if context == "base":
                    pins, ref = {**base_pins, pkg: bumps[pkg]}, before
                else:
                    pins, ref = {**target_pins, pkg: base_pins[pkg]}, after
                what = f"{context} with {pkg} {pins[pkg]} only"
                try:
                    seen = _verdicts(env_run(pins, what, unexplained))
                except EnvError as exc:
                    # e.g. a new peft that needs a new transformers: this context cannot tell, the next one may
                    say(f"{exc}: not attributable in that context")
                    unbuilt.append(what)
                    continue
                moved = [c for c in unexplained if c in seen and seen[c] != ref[c]]
                if moved:
                    groups[(pkg, context)] = moved
            unexplained = [c for c in unexplained if not any(c in g for g in groups.values())]
        for cell in unexplained:
            why = f" ({', '.join(unbuilt)}: the env cannot be built)" if unbuilt else ""
            by_cell[cell].answer = f"no single bumped package changes it alone: the bumps act together{why}"

    bound = 2 + (0 if len(bumps) == 1 else len({tuple(sorted(p.items())) for p in _attribution_pins(bumps, base_pins)}))
    for (pkg, context), group in groups.items():
        held = base_pins if context == "base" else {**target_pins, pkg: base_pins[pkg]}
        low = runs[tuple(sorted(held.items()))]
        high = runs[tuple(sorted({**held, pkg: bumps[pkg]}.items()))]
        try:
            cands = _ordered(pkg, base_pins[pkg], bumps[pkg], pre, candidates)
        except EnvError as exc:
            for cell in group:
                by_cell[cell].answer = "; ".join(filter(None, [by_cell[cell].answer, f"cannot bisect {pkg}: {exc}"]))
            continue
        bound += math.ceil(math.log2(len(cands))) if len(cands) > 1 else 0
        others = "" if len(bumps) == 1 else f" (others held at the {context})"
        say(f"bisecting {pkg} over {len(cands)} releases {cands[0]} .. {cands[-1]}{others} for {len(group)} cells")

        def started(candidate: str, todo: Sequence[str], pkg: str = pkg) -> None:
            if beat:
                beat.update(f"bisect {pkg} {candidate}: {len(todo)} cells", say=True)

        def ended(step: Step, pkg: str = pkg) -> None:
            what = f"{len(step.outcomes)} cells ran" if step.installed else f"skipped: {step.reason[:120]}"
            say(f"step {pkg} {step.candidate}: {what} ({fmt_seconds(step.seconds)})")

        found = bisect_cells(
            _Bumped(installer, held, pkg),
            runner,
            cands,
            group,
            pkg,
            known={0: {c: low[c] for c in group if c in low}, len(cands) - 1: {c: high[c] for c in group if c in high}},
            same=_same_verdict,
            on_start=started,
            on_step=ended,
        )
        for cell in group:
            ans = found.cells[cell]
            entry = by_cell[cell]
            if ans.first_changed:
                entry.first_changed[pkg] = ans.first_changed
                entry.last_unchanged[pkg] = ans.last_unchanged
            entry.answer = "; ".join(filter(None, [entry.answer, ans.answer + others]))
        if pkg in git:
            seen = seen_at(cands, low, high, found.steps)
            for line in commit_lines(pkg, git[pkg], held, group, by_cell, seen, installer, runner, cache, say):
                result.commit_lines.append(line)
                bound += line.install_bound
    distinct = {tuple(sorted(log.pins.items())): log for log in installer.log}
    result.installs = len(distinct)
    result.installed = sum(1 for log in distinct.values() if not log.reused)
    result.install_bound = bound
    result.launches = getattr(runner, "launches", 0)
    result.wall_s = time.monotonic() - start
    return result


def _attribution_pins(bumps: Mapping[str, str], base_pins: Pins) -> List[Pins]:
    target = {**base_pins, **bumps}
    return [{**base_pins, p: v} for p, v in bumps.items()] + [{**target, p: base_pins[p]} for p in bumps]


def render(result: UpgradeResult) -> str:
    out = [f"{len(result.changed)} of {result.cells} cells changed verdict"]
    width = max((len(c.cell) for c in result.changed), default=0)
    for c in result.changed:
        first = ", ".join(f"{k} {v}" for k, v in c.first_changed.items()) or "-"
        out.append(
            f"  {c.cell:<{width}}  {symbol(c.base_verdict)} -> {symbol(c.target_verdict)}  first changed: {first}"
        )
        out.append(f"  {'':<{width}}  {c.answer}")
        for pkg, commit in c.first_changed_commit.items():
            pr = f" (PR #{commit['pr']})" if commit.get("pr") else ""
            out.append(f"  {'':<{width}}  first changed commit: {pkg} {commit['sha']} {commit['subject']!r}{pr}")
    for cell, why in result.untestable.items():
        out.append(f"  untestable {cell}: {why}")
    out.append(
        f"installs: {result.installs} envs ({result.installed} installed, {result.installs - result.installed} "
        f"reused), bound {result.install_bound} plus skips; {result.launches} launches; {fmt_seconds(result.wall_s)}"
    )
    for line in result.commit_lines:
        what = line.error or (
            f"{line.commits} commits from the merge base {line.merge_base[:10]}, {line.steps} steps for "
            f"{len(line.cells)} cells (bound {line.install_bound} plus skips)"
        )
        out.append(f"commit bisect {line.package} {line.last_release} .. {line.first_release}: {what}")
    if result.regressions:
        out.append(f"REGRESSION in {len(result.regressions)} cells: " + ", ".join(c.cell for c in result.regressions))
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    from fsdp_matrix.bisect.cli import DEFAULT_CACHE

    p = OneLineParser(prog="fsdp-matrix upgrade", description=__doc__.split("\n\n")[0])
    p.add_argument("bumps", nargs="+", metavar="NAME==VERSION", help="the versions to upgrade to")
    p.add_argument("--combo", help="base combo (default: the newest cpu combo)")
    p.add_argument("--cases", action="append", default=[], help="case ids, comma-separated (default: all)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write base, target and changed cells as JSON")
    # launch options, declared once (runner/options.py)
    options.add_arguments(
        p.add_argument, ("matrix", "device", "world_size"), choices=CONCRETE_DEVICE, defaults={"world_size": 2}
    )
    p.add_argument("--pre", action="store_true", help="let pre-releases be bisection candidates")
    p.add_argument(
        "--git",
        action="append",
        default=[],
        metavar="NAME=REPO",
        help="then bisect NAME's commits between the last unchanged and the first changed release (a clone or URL)",
    )
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where envs and their records live (reused)")
    p.add_argument("--timeout", type=positive_seconds, default=3600, help="seconds one launch may take")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from fsdp_matrix.bisect.runner import LaunchRunner

    args = parser().parse_intermixed_args(argv)
    try:
        bumps = parse_pins(args.bumps, "upgrade")
        repos = parse_git_args(args.git, bumps)
        matrix = load_matrix(args.matrix)
        base = matrix.combo(args.combo) if args.combo is not None else matrix.newest("cpu")
        cases = [c for text in args.cases for c in text.split(",") if c] or None
        for case in cases or []:
            matrix.case(case)
        cells = [c.key for c in expand(matrix, args.device, args.world_size, cases=cases)]
        if args.json:
            writable_file(args.json)
        usable_dir(args.cache)
        installer = PinnedInstaller(base, "peft", args.cache, device=args.device)
        with Heartbeat("upgrade", "starting") as beat:
            runner = LaunchRunner(
                args.cache,
                matrix=args.matrix,
                device=args.device,
                world_size=args.world_size,
                timeout=args.timeout,
                say=beat.say,
                status=beat.update,
            )
            result = run_upgrade(base, bumps, cells, installer, runner, pre=args.pre, beat=beat, git=repos)
    except MatrixError as exc:
        print(f"fsdp-matrix upgrade: {flat(exc)}", file=sys.stderr)
        return 2
    print(render(result), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_json(), indent=1, default=str))
    return 1 if result.regressions else 0
