"""Cells at one commit of the package under test: its build over a combo's other pins, in a step env keyed on the
commit, the cells on one launch, read back from their records (the commit bisect's installer and runner,
bisect/wiring.py). The base's records are kept by commit under the cache, so a base that was run already is read
back, not run again (where the cache is shared: docs/pages/gate.md); the head always runs fresh (``fresh=True``), so
a lucky pass of a flaky head is never read back by a re-run of the job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from fsdp_matrix.bisect.commits import CommitInstaller
from fsdp_matrix.bisect.installers import parse_pins
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import CellOutcome, Untestable
from fsdp_matrix.bisect.wiring import bisection_from
from fsdp_matrix.clip import clip
from fsdp_matrix.envs.sources import resolve_pins
from fsdp_matrix.errors import EnvError
from fsdp_matrix.gate.request import GateRequest
from fsdp_matrix.matrix import Combo


def last_line(text: str) -> str:
    """The most specific line of an installer's or a launch's output: its last (uv draws a tree in front of it)."""
    lines = [line.strip(" │├╰─▶×") for line in text.splitlines() if line.strip(" │├╰─▶×")]
    return lines[-1] if lines else text


@dataclass(frozen=True)
class Seen:
    """What one cell did at one commit: an outcome with its verdict, or why it could not run."""

    outcome: Optional[Outcome] = None
    """Status, error type, normalised message and verdict; None when the cell could not run."""
    reason: str = ""
    """Why it could not run (the build failed, an env-error record, no record)."""

    @property
    def verdict(self) -> str:
        """The verdict, or ``env-error`` when it could not run."""
        return (self.outcome.verdict if self.outcome else None) or "env-error"

    @property
    def why(self) -> str:
        """The reason's most specific line, clipped in its middle: its start says what failed, its end the name
        that is missing (``ImportError: cannot import name 'X'``), and a path between them is what goes."""
        return clip(last_line(self.reason), 240, middle=True)

    def describe(self) -> str:
        return self.outcome.describe() if self.outcome else f"env-error ({self.why})"


@dataclass
class AtCommit:
    """Every selected cell of one combo at one commit."""

    combo: str
    """The combo's id."""
    commit: str
    """The package's full SHA."""
    cells: Dict[str, Seen] = field(default_factory=dict)
    """Cell key -> what it did."""
    built: bool = True
    """False when the commit did not build or import: every cell holds the reason."""
    reused: bool = False
    """Every record was already there (the cache held this commit's run)."""


class CellRuns(Protocol):
    """Runs cells of a combo at a commit of the package under test. ``fresh`` asks for a new launch whose records
    are not the cached ones (what a confirm step reruns a flipped cell in)."""

    def run(self, combo: Combo, commit: str, cells: Sequence[str], fresh: bool = False) -> AtCommit: ...


def seen(outcomes: Mapping[str, CellOutcome], cells: Sequence[str], reason: str) -> Dict[str, Seen]:
    """Each cell's Seen from a runner's answer (a cell missing from it could not run: ``reason``)."""
    out: Dict[str, Seen] = {}
    for cell in cells:
        got = outcomes.get(cell)
        out[cell] = Seen(got) if isinstance(got, Outcome) else Seen(None, str(got) if got else reason)
    return out


class LaunchCellRuns:
    """The real CellRuns: CommitInstaller + LaunchRunner per combo, over the request's step options."""

    def __init__(
        self, req: GateRequest, say: Callable[[str], None] = print, status: Callable[[str], None] = lambda t: None
    ) -> None:
        self.req, self.say, self.status = req, say, status
        self.releases = parse_pins([t for t in req.holds if "==" in t], what="--hold")
        self.held = resolve_pins([t for t in req.holds if "==" not in t], req.step.cache / "sources")
        if req.pin.package in self.held or req.pin.package in self.releases:
            raise EnvError(f"--hold {req.pin.package}: {req.pin.package} is the package under test (--pin)")
        self._wired: Dict[Tuple[str, bool], Tuple[CommitInstaller, LaunchRunner]] = {}

    def _wiring(self, combo: Combo, fresh: bool) -> Tuple[CommitInstaller, LaunchRunner]:
        key = (combo.id, fresh)
        if key not in self._wired:
            package = self.req.pin.package
            wired = bisection_from(
                self.req.step,
                combo,
                package=package,
                pins=self.releases,
                say=self.say,
                status=self.status,
                resume=not fresh,  # a fresh launch: records of its own, not the cached ones
                label=lambda sha: f"{combo.id}: {package} {sha[:10]}",
            )
            installer = CommitInstaller(wired.installer, self.req.pin, self.req.step.cache / "sources", held=self.held)
            self._wired[key] = (installer, wired.runner)
        return self._wired[key]

    def run(self, combo: Combo, commit: str, cells: Sequence[str], fresh: bool = False) -> AtCommit:
        installer, runner = self._wiring(combo, fresh)
        prepared = installer.prepare(commit)
        if prepared.env is None:
            reason = f"{self.req.pin.package} {commit[:10]} did not build or import: {last_line(prepared.reason)}"
            return AtCommit(combo.id, commit, {c: Seen(None, reason) for c in cells}, built=False)
        before = runner.launches
        try:
            outcomes: Mapping[str, CellOutcome] = runner.run_cells(prepared.env, commit, list(cells))
        except Untestable as exc:
            outcomes = {}
            reason = str(exc)
        else:
            reason = "no record"
        return AtCommit(combo.id, commit, seen(outcomes, cells, reason), reused=runner.launches == before)


def unbuilt(at: List[AtCommit]) -> List[AtCommit]:
    """The runs whose commit did not build."""
    return [a for a in at if not a.built]
