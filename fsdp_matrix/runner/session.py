"""One run of cells in one env: decide what runs, hand it to the launcher, turn what comes back into records.

Both front ends use it: the pytest plugin (one test per cell) and ``python -m fsdp_matrix run`` (bisect, scripts).
"""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_matrix import records
from fsdp_matrix.cells import Cell, matches, unmet_requirement
from fsdp_matrix.envs.direct import installed_sources
from fsdp_matrix.envs.sources import rule_versions
from fsdp_matrix.errors import LaunchError, ResultsError
from fsdp_matrix.expectations import Expected, expected_for
from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix
from fsdp_matrix.records import Observed, Record
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.protocol import Task
from fsdp_matrix.runner.watching import CellRun
from fsdp_matrix.verdicts import ABOUT_THE_BUG, Verdict, make_record

KEPT_ON_RESUME = ABOUT_THE_BUG | {Verdict.SKIPPED.value}
"""Verdicts that ``--resume`` keeps: the cell ran to an outcome about the bug, or was decided not to run here."""


HARNESS_CODE = (
    "workload",
    "runner",
    "case.py",
    "cells.py",
    "expectations.py",
    "match.py",
    "patterns.py",
    "records.py",
    "rules.py",
    "verdicts.py",
)
"""The harness's code that runs a cell and judges it (``fsdp_matrix/`` paths): what ``harness_version`` digests."""


@functools.cache
def harness_version() -> str:
    """``<record schema>-<12 hex digits>``: the record schema and a sha256 of HARNESS_CODE's Python files (path and
    bytes). Stamped on every record; ``--resume`` keeps only records of the running harness, since a newer one judges
    with more checks (records of a harness before the collectives check were kept: reliability review 2026-11-28,
    defect 5). Any change to that code reruns the cells, a docstring's too: a stale verdict costs more than a rerun."""
    root = Path(records.__file__).resolve().parent
    digest = hashlib.sha256()
    for part in HARNESS_CODE:
        files = [root / part] if part.endswith(".py") else sorted((root / part).rglob("*.py"))
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return f"{records.SCHEMA}-{digest.hexdigest()[:12]}"


def resumable(rec: Record) -> bool:
    """Does ``--resume`` keep this record? Not for env-error (the env may be fixed now), hang and crash (the run or a
    rank may have been cut off by what happened around it: a kill, the OOM killer, a stalled machine), nor for a
    verdict this version does not know. Those cells run again; a real crash or hang is simply recorded again."""
    return rec.verdict in KEPT_ON_RESUME


def observe(run: CellRun) -> Observed:
    """Fold per-rank results into one outcome: the lowest erroring rank speaks for the cell."""
    # the rank whose status is the cell's speaks for it: the crashed one for a crash, the raising one for an error
    first = next((r for r in run.ranks if r.status == run.status), None) or next(
        (r for r in run.ranks if r.status != "ok"), None
    )
    checks = next((r.checks for r in run.ranks if r.rank == 0 and r.checks), {})
    if run.status == "env-error":
        return replace(records.env_error(run.note, "LaunchError"), env_removed=run.env_removed)
    if run.status == "ok":
        return Observed(
            status="ok",
            checks=checks,
            ranks=run.ranks,
            detect_s=run.detect_s,
            note=run.note,
            env_removed=run.env_removed,
        )
    return Observed(
        env_removed=run.env_removed,
        status=run.status,
        error_type=first.error_type if first else None,
        error_message=first.error_message if first else run.note,
        location=first.location if first else None,
        checks=checks,
        ranks=run.ranks,
        detect_s=run.detect_s,
        note=run.note,
    )


@dataclass
class Session:
    """The cells of one env, device and world size, and where their records go."""

    matrix: Matrix
    """The parsed matrix.yaml."""
    launcher: Launcher
    """Runs the cells that do run."""
    results: Path
    """Directory of cells.jsonl."""
    versions: Dict[str, Optional[str]]
    """What is installed here: every expectation is evaluated against it."""
    combo: Optional[str] = None
    """Combo id when run under nox."""
    resume: bool = False
    """Reuse records already in cells.jsonl instead of re-running those cells (see ``resumable``)."""
    repo_root: Path = DEFAULT_MATRIX.parent
    """Where repro paths in matrix.yaml are relative to."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Stamped on every record of this session."""
    make_launcher: Optional[Callable[[int, int], Launcher]] = None
    """A launcher for the cells of another layout (world size, nodes), or LaunchError saying in one line why this
    run cannot launch it; None: only ``launcher``'s layout runs here. A cell never runs at another world size than
    its id's: cells are grouped by layout, each group in launches of its own size, or skipped with that line."""

    def __post_init__(self) -> None:
        # a stand-in launcher without a layout (a test's) runs the default cells: 2 ranks on one node
        layout = getattr(self.launcher, "layout", (getattr(self.launcher, "world_size", 2), 1))
        self._launchers: Dict[Tuple[int, int], Launcher] = {layout: self.launcher}
        self._refused: Dict[Tuple[int, int], str] = {}
        self._active: Optional[Launcher] = None
        records.check_appendable(self.results)  # before any launch: a cell that ran must not lose its verdict
        self.sources: Dict[str, Dict] = installed_sources(self.versions)
        """This env's source builds (a nox source pin, or a PEP 610 direct URL: fsdp_matrix.envs.direct): stamped on
        every record, and matched by --resume."""
        self._recorded: Dict[Tuple[str, str], Record] = {}
        if self.resume and (self.results / records.RECORDS_FILE).exists():
            newest: Dict[Tuple[str, str], Record] = {}
            for rec in records.iter_records(self.results / records.RECORDS_FILE):
                if self._same_env(rec) and self._same_harness(rec):
                    key = (rec.key, rec.device)
                    if key not in newest or rec.finished_at >= newest[key].finished_at:
                        newest[key] = rec
            self._recorded = {key: rec for key, rec in newest.items() if resumable(rec)}
        self._records: Dict[str, Record] = {}

    def _same_env(self, rec: Record) -> bool:
        """A record of this run's env: the same combo id, and what it recorded as installed is what is installed now
        (every version, python's too, and the same source builds). A combo id stays while its pins are bumped, and
        the floating combo's versions move nightly: a record made before is another env's answer."""
        return rec.combo == self.combo and rec.versions == dict(self.versions) and rec.sources == self.sources

    @staticmethod
    def _same_harness(rec: Record) -> bool:
        """A record this harness would write: the same record schema and harness version (``harness_version``)."""
        return rec.schema == records.SCHEMA and rec.harness == harness_version()

    def _requires(self, cell: Cell) -> List[Dict[str, Any]]:
        """The case's requirements that apply to ``cell`` (their ``when`` matches it), as matrix.yaml gives them."""
        ctx = cell.context()
        return [
            r.model_dump(mode="json", exclude_defaults=True)
            for r in self.matrix.case(cell.case).requires
            if matches(r.when, ctx)
        ]

    def expected(self, cell: Cell) -> Expected:
        # a source build is judged as its release base (fsdp_matrix.envs.sources.rule_versions)
        return expected_for(self.matrix.case(cell.case), cell, rule_versions(self.versions, self.sources))

    def _resumed(self, cell: Cell, expected: Expected) -> Optional[Record]:
        """The earlier record ``--resume`` keeps for this cell: one of this env and harness, judged under the rule
        that decides the cell now, and skipped (or not) for the same reason as now. After a rule is fixed, its cells
        run again rather than keep the old rule's verdict; a skip whose requirement was lifted runs, and a run whose
        case now requires what this run lacks is skipped."""
        rec = self._recorded.get((cell.key, cell.device))
        if rec is None or not expected.judges_like(rec.expected):
            return None
        if rec.verdict == Verdict.SKIPPED.value:
            return rec if self._skip_reason(cell, expected) == rec.observed.error_message else None
        return rec if unmet_requirement(self.matrix.case(cell.case).requires, cell) is None else None

    def prefetch(self, cells: List[Cell]) -> None:
        """Queue every cell that will run, so ranks go from one to the next without waiting for the caller."""
        for cell in cells:
            expected = self.expected(cell)
            if self._resumed(cell, expected) is None and self._skip_reason(cell, expected) is None:
                self._launcher(cell).submit(self._task(cell))

    def _launcher(self, cell: Cell) -> Launcher:
        """The launcher of the cell's layout (made on first use); ``_layout_refused`` has said it can be made."""
        if cell.layout not in self._launchers:
            self._launchers[cell.layout] = self.make_launcher(*cell.layout)
        return self._launchers[cell.layout]

    def _layout_refused(self, cell: Cell) -> Optional[str]:
        """Why this run cannot launch the cell's layout, or None."""
        if cell.layout in self._launchers:
            return None
        if cell.layout not in self._refused:
            if self.make_launcher is None:
                ws, nodes = next(iter(self._launchers))
                self._refused[cell.layout] = f"this run launches only {_layout_text(ws, nodes)}"
            else:
                try:
                    self._launchers[cell.layout] = self.make_launcher(*cell.layout)
                    return None
                except LaunchError as exc:
                    self._refused[cell.layout] = str(exc)
        ws, nodes = cell.layout
        return f"needs {_layout_text(ws, nodes)} (its id's world size): {self._refused[cell.layout]}"

    def _switch(self, launcher: Launcher) -> None:
        """Before a cell of another layout: stop the launch of the last one if nothing is queued there any more, so
        that two layouts' ranks do not sit in memory side by side."""
        idle = getattr(self._active, "idle", lambda: False)
        if self._active is not None and self._active is not launcher and idle():
            self._active.close()
        self._active = launcher

    def run(self, cell: Cell) -> Record:
        """The record of one cell: resumed, skipped, or run now. Appended to cells.jsonl as soon as it exists."""
        if cell.key in self._records:
            return self._records[cell.key]
        expected = self.expected(cell)
        resumed = self._resumed(cell, expected)
        if resumed is not None:
            return resumed
        reason = self._skip_reason(cell, expected)
        if reason is not None:
            rec = make_record(
                cell,
                expected,
                Observed(status="skipped", error_message=reason),
                self.versions,
                0.0,
                self.combo,
                self.run_id,
                self.sources,
            )
        else:
            self._results_file()
            launcher = self._launcher(cell)
            self._switch(launcher)
            launcher.submit(self._task(cell))
            start = time.monotonic()
            run = launcher.wait(cell.key)
            rec = make_record(
                cell,
                expected,
                observe(run),
                self.versions,
                run.duration_s or time.monotonic() - start,
                self.combo,
                self.run_id,
                self.sources,
            )
        rec = replace(rec, harness=harness_version(), requires=self._requires(cell))
        file = self._results_file()
        try:
            records.append(self.results, rec)
        except OSError as exc:  # a full disk, a file made immutable: the run stops rather than lose every verdict
            raise ResultsError(f"cannot append records to {file}: {exc.strerror or exc}") from None
        self._records[cell.key] = rec
        return rec

    def _results_file(self) -> Path:
        """cells.jsonl, which check_appendable created: gone means the results were removed during the run, and a
        new file would hold only what comes after, so the run stops (ResultsError) instead."""
        file = self.results / records.RECORDS_FILE
        if not file.exists():
            raise ResultsError(f"{file} was removed during the run: stopping (records written to it are gone)")
        return file

    def _skip_reason(self, cell: Cell, expected: Expected) -> Optional[str]:
        reason = unmet_requirement(self.matrix.case(cell.case).requires, cell) or self._layout_refused(cell)
        if reason:
            return reason
        return f"{expected.reason} [{expected.source}]" if expected.kind == "skip" else None

    def _task(self, cell: Cell) -> Task:
        repro = (self.repo_root / self.matrix.case(cell.case).repro).resolve()
        # a rule that expects a hang gives the cell its own short timeout: a known hang costs seconds
        return Task(key=cell.key, repro=str(repro), params=cell.params_dict, timeout_s=self.expected(cell).timeout_s)

    def close(self) -> None:
        failed = None
        for launcher in self._launchers.values():
            try:
                launcher.close()
            except LaunchError as exc:  # close every one before saying so
                failed = failed or exc
        if failed is not None:
            raise failed


def _layout_text(world_size: int, nodes: int) -> str:
    if nodes == 1:
        return f"{world_size} rank{'s' if world_size > 1 else ''} on one node"
    return f"{world_size} ranks on {nodes} nodes ({world_size // nodes} each)"
