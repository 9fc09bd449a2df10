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

from fsdp_matrix import options
from fsdp_matrix.bisect.installers import PinnedInstaller, parse_pins
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.releases import release_candidates
from fsdp_matrix.bisect.runner import stopped_by_signal
from fsdp_matrix.bisect.search import CellsRunner, Prepared, Step, Untestable, bisect_cells
from fsdp_matrix.bisect.upgrade_git import CommitLine, commit_lines, parse_git_args, seen_at
from fsdp_matrix.bisect.wiring import StepOptions, add_step_arguments, bisection_from
from fsdp_matrix.cells import expand
from fsdp_matrix.envs.sources import SourcePin
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.matrix import Combo, load_matrix
from fsdp_matrix.paths import writable_file
from fsdp_matrix.progress import Heartbeat, fmt_seconds
from fsdp_matrix.report.style import symbol
from fsdp_matrix.usage import OneLineParser, flat
from fsdp_matrix.verdicts import Verdict

Pins = Dict[str, str]
Observed = Mapping[str, Any]
"""cell -> Outcome (with its verdict) or Untestable, as a CellsRunner answers."""


@dataclass
class Changed:
    """One cell whose outcome (verdict, or the error it raised) differs between base and target."""

    cell: str
    base_verdict: str
    target_verdict: str
    base_outcome: str = ""
    """What the cell did on the base: its verdict and error (``reproduced (ValueError: ...)``)."""
    target_outcome: str = ""
    """The same on the target: a change from one expected error to another shows here with equal verdicts."""
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


def _outcomes(observed: Observed) -> Dict[str, Outcome]:
    return {c: o for c, o in observed.items() if isinstance(o, Outcome)}


def _same_outcome(a: Outcome, b: Outcome) -> bool:
    # verdict and error: an expected error replaced by another expected one is a change (bisect compares so too);
    # comparing verdicts alone hid it, and the bisect's "last unchanged" then quoted the base's error
    return a == b


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
    (bisect/upgrade_git.py); ``cache`` holds their snapshots (default: the installer's).

    The steps: check the bumps, run both ends, attribute each changed cell to one bumped package, bisect each
    package's releases (then its commits), tally the cost."""
    start = time.monotonic()
    up = _Upgrade(base, _checked_bumps(base, bumps, pre, candidates or release_candidates), cells, installer, runner)
    up.pre, up.candidates, up.beat, up.git = pre, candidates or release_candidates, beat, dict(git or {})
    up.cache = cache or getattr(installer, "cache", None)
    up.say = beat.say if beat else print
    changed = _run_ends(up)
    groups = _attribute(up, changed)
    bound = 2 + (
        0 if len(up.bumps) == 1 else len({tuple(sorted(p.items())) for p in _attribution_pins(up.bumps, up.base_pins)})
    )
    for (pkg, context), group in groups.items():
        bound += _bisect_group(up, pkg, context, group)
    distinct = {tuple(sorted(log.pins.items())): log for log in installer.log}
    result = up.result
    result.installs = len(distinct)
    result.installed = sum(1 for log in distinct.values() if not log.reused)
    result.install_bound = bound
    result.launches = getattr(runner, "launches", 0)
    result.wall_s = time.monotonic() - start
    return result


def _checked_bumps(base: Combo, bumps: Mapping[str, str], pre: bool, candidates: Callable[..., List[str]]) -> Pins:
    """The bumps by canonical name; EnvError (one line) for one the base does not pin, or already pins."""
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
    return bumps


class _Upgrade:
    """One upgrade check under way: its inputs, the runs made so far (by pin set) and the result it fills."""

    def __init__(
        self, base: Combo, bumps: Pins, cells: Sequence[str], installer: PinnedInstaller, runner: CellsRunner[Path]
    ) -> None:
        self.base, self.bumps, self.cells, self.installer, self.runner = base, bumps, list(cells), installer, runner
        self.base_pins: Pins = base.pins.model_dump()
        self.target_pins: Pins = {**self.base_pins, **bumps}
        self.pre = False
        self.candidates: Callable[..., List[str]] = release_candidates
        self.beat: Optional[Heartbeat] = None
        self.git: Dict[str, SourcePin] = {}
        self.cache: Optional[Path] = None
        self.say: Callable[[str], None] = print
        self.runs: Dict[Tuple[Tuple[str, str], ...], Observed] = {}
        self.result = UpgradeResult(
            {"combo": base.id, "pins": self.base_pins},
            {"pins": self.target_pins, "bumped": {k: [self.base_pins[k], v] for k, v in bumps.items()}},
            cells=len(self.cells),
        )
        self.by_cell: Dict[str, Changed] = {}
        self.before: Dict[str, Outcome] = {}
        self.after: Dict[str, Outcome] = {}

    def env_run(self, pins: Pins, what: str, wanted: Sequence[str]) -> Observed:
        """The cells of ``wanted`` run in the env of ``pins`` (each pin set installed and each cell run once)."""
        key = tuple(sorted(pins.items()))
        have = self.runs.get(key, {})
        need = [c for c in wanted if c not in have]
        if need:
            if self.beat:
                self.beat.update(f"{what}: preparing the env", say=True)
            prepared = self.installer.install(pins, list(self.base.extra))
            if not prepared.ok:
                raise EnvError(f"{what}: the env cannot be prepared: {prepared.reason}")
            try:
                have = {**have, **self.runner.run_cells(prepared.env, what, need)}
            except Untestable as exc:
                raise EnvError(f"{what}: no cell could run: {exc}") from None
            self.runs[key] = have
        return have

    def ran(self, pins: Pins) -> Observed:
        return self.runs[tuple(sorted(pins.items()))]


def _run_ends(up: _Upgrade) -> List[str]:
    """Every cell on the base and on the target; the cells whose verdict changed."""
    bumps, base_pins, cells = up.bumps, up.base_pins, up.cells
    up.say(f"base {up.base.id}: " + ", ".join(f"{k} {v}" for k, v in base_pins.items()))
    up.say("target: " + ", ".join(f"{k} {base_pins[k]} -> {v}" for k, v in bumps.items()) + f"; {len(cells)} cells")
    on_base = up.env_run(base_pins, "base", cells)
    on_target = up.env_run(up.target_pins, "target", cells)
    up.before, up.after = before, after = _outcomes(on_base), _outcomes(on_target)
    for cell in cells:
        if cell not in before or cell not in after:
            why = on_base.get(cell) if cell not in before else on_target.get(cell)
            up.result.untestable[cell] = f"{'base' if cell not in before else 'target'}: {why or 'no record'}"
    changed = [c for c in cells if c in before and c in after and not _same_outcome(before[c], after[c])]
    up.result.changed = [
        Changed(c, str(before[c].verdict), str(after[c].verdict), before[c].describe(), after[c].describe())
        for c in changed
    ]
    up.say(f"{len(changed)} of {len(cells)} cells changed verdict or error")
    up.by_cell = {c.cell: c for c in up.result.changed}
    return changed


def _attribute(up: _Upgrade, changed: List[str]) -> Dict[Tuple[str, str], List[str]]:
    """Which bumped package changes each cell: alone on the base, else reverted alone from the target.
    (package, context) -> the cells it explains there."""
    groups: Dict[Tuple[str, str], List[str]] = {}
    if not changed:
        return groups
    if len(up.bumps) == 1:
        groups[(next(iter(up.bumps)), "base")] = changed
        return groups
    unexplained = list(changed)
    unbuilt: List[str] = []
    for context in ("base", "target"):
        for pkg in up.bumps:
            # on the base, one package that changes a cell alone explains it: stop once every cell has one. A
            # cell left for the target needs several bumps together, and reverting each of them tells
            if not unexplained or (
                context == "base" and all(any(c in g for g in groups.values()) for c in unexplained)
            ):
                break
            moved = _moved_alone(up, pkg, context, unexplained, unbuilt)
            if moved:
                groups[(pkg, context)] = moved
        unexplained = [c for c in unexplained if not any(c in g for g in groups.values())]
    for cell in unexplained:
        why = f" ({', '.join(unbuilt)}: the env cannot be built)" if unbuilt else ""
        up.by_cell[cell].answer = f"no single bumped package changes it alone: the bumps act together{why}"
    return groups


def _moved_alone(up: _Upgrade, pkg: str, context: str, cells: List[str], unbuilt: List[str]) -> List[str]:
    """The cells of ``cells`` whose verdict moves with ``pkg`` alone: bumped on the base, or reverted from the
    target. An env that cannot be built is noted in ``unbuilt`` and explains nothing."""
    if context == "base":
        pins, ref = {**up.base_pins, pkg: up.bumps[pkg]}, up.before
    else:
        pins, ref = {**up.target_pins, pkg: up.base_pins[pkg]}, up.after
    what = f"{context} with {pkg} {pins[pkg]} only"
    try:
        seen = _outcomes(up.env_run(pins, what, cells))
    except EnvError as exc:
        # e.g. a new peft that needs a new transformers: this context cannot tell, the next one may
        up.say(f"{exc}: not attributable in that context")
        unbuilt.append(what)
        return []
    return [c for c in cells if c in seen and not _same_outcome(seen[c], ref[c])]


def _bisect_group(up: _Upgrade, pkg: str, context: str, group: List[str]) -> int:
    """Bisect ``pkg``'s releases for the cells it explains in ``context`` (the others held there), then its
    commits with --git; the installs this adds to the bound."""
    held = up.base_pins if context == "base" else {**up.target_pins, pkg: up.base_pins[pkg]}
    low, high = up.ran(held), up.ran({**held, pkg: up.bumps[pkg]})
    try:
        cands = _ordered(pkg, up.base_pins[pkg], up.bumps[pkg], up.pre, up.candidates)
    except EnvError as exc:
        for cell in group:
            up.by_cell[cell].answer = "; ".join(filter(None, [up.by_cell[cell].answer, f"cannot bisect {pkg}: {exc}"]))
        return 0
    bound = math.ceil(math.log2(len(cands))) if len(cands) > 1 else 0
    others = "" if len(up.bumps) == 1 else f" (others held at the {context})"
    up.say(f"bisecting {pkg} over {len(cands)} releases {cands[0]} .. {cands[-1]}{others} for {len(group)} cells")
    found = bisect_cells(
        _Bumped(up.installer, held, pkg),
        up.runner,
        cands,
        group,
        pkg,
        known={0: {c: low[c] for c in group if c in low}, len(cands) - 1: {c: high[c] for c in group if c in high}},
        same=_same_outcome,
        **_hooks(up, pkg),
    )
    for cell in group:
        ans, entry = found.cells[cell], up.by_cell[cell]
        if ans.first_changed:
            entry.first_changed[pkg] = ans.first_changed
            entry.last_unchanged[pkg] = ans.last_unchanged or ""
        entry.answer = "; ".join(filter(None, [entry.answer, ans.answer + others]))
    if pkg in up.git:
        seen = seen_at(cands, low, high, found.steps)
        lines = commit_lines(pkg, up.git[pkg], held, group, up.by_cell, seen, up.installer, up.runner, up.cache, up.say)
        up.result.commit_lines += lines
        bound += sum(line.install_bound for line in lines)
    return bound


def _hooks(up: _Upgrade, pkg: str) -> Dict[str, Any]:
    def started(candidate: str, todo: Sequence[str]) -> None:
        if up.beat:
            up.beat.update(f"bisect {pkg} {candidate}: {len(todo)} cells", say=True)

    def ended(step: Step) -> None:
        what = f"{len(step.outcomes)} cells ran" if step.installed else f"skipped: {step.reason[:120]}"
        up.say(f"step {pkg} {step.candidate}: {what} ({fmt_seconds(step.seconds)})")

    return dict(on_start=started, on_step=ended)


def _attribution_pins(bumps: Mapping[str, str], base_pins: Pins) -> List[Pins]:
    target = {**base_pins, **bumps}
    return [{**base_pins, p: v} for p, v in bumps.items()] + [{**target, p: base_pins[p]} for p in bumps]


def render(result: UpgradeResult) -> str:
    out = [f"{len(result.changed)} of {result.cells} cells changed verdict or error"]
    width = max((len(c.cell) for c in result.changed), default=0)
    for c in result.changed:
        # "changed at": the release where what the cell does first differs (a fix that changes the error, or a
        # break): "first changed: X" after "R -> !R" read as "X broke it"
        first = ", ".join(f"{k} {v}" for k, v in c.first_changed.items()) or "-"
        out.append(f"  {c.cell:<{width}}  {symbol(c.base_verdict)} -> {symbol(c.target_verdict)}  changed at: {first}")
        if c.base_outcome:
            out.append(f"  {'':<{width}}  base: {c.base_outcome}; target: {c.target_outcome}")
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
    p = OneLineParser(prog="fsdp-matrix upgrade", description=__doc__.split("\n\n")[0])
    p.add_argument("bumps", nargs="+", metavar="NAME==VERSION", help="the versions to upgrade to")
    options.add_arguments(p.add_argument, ("combo",), model=options.MatrixOptions)  # declared once
    p.add_argument("--cases", action="append", default=[], help="case ids, comma-separated (default: all)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write base, target and changed cells as JSON")
    p.add_argument("--pre", action="store_true", help="let pre-releases be bisection candidates")
    p.add_argument(
        "--git",
        action="append",
        default=[],
        metavar="NAME=REPO",
        help="then bisect NAME's commits between the last unchanged and the first changed release (a clone or URL)",
    )
    # the step options, declared once (bisect/wiring.py)
    add_step_arguments(p, timeout=3600, world_size=2, cache_help="where envs and their records live (reused)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    return stopped_by_signal("fsdp-matrix upgrade", lambda: _main(argv))


def _main(argv: Optional[Sequence[str]]) -> int:
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
        with Heartbeat("upgrade", "starting") as beat:
            wired = bisection_from(StepOptions.from_args(args), base, say=beat.say, status=beat.update)
            result = run_upgrade(base, bumps, cells, wired.installer, wired.runner, pre=args.pre, beat=beat, git=repos)
    except MatrixError as exc:
        print(f"fsdp-matrix upgrade: {flat(exc)}", file=sys.stderr)
        return 2
    print(render(result), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_json(), indent=1, default=str))
    return 1 if result.regressions else 0
