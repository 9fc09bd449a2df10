"""Records: one JSON line per cell in ``<results>/cells.jsonl``, appended the moment the cell ends.

The file is shared by xdist workers and by concurrent runs, so each append takes a lock and writes one whole line.
Readers skip a torn last line (a run killed mid-write) instead of failing the whole report.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from filelock import FileLock

SCHEMA = 1
RECORDS_FILE = "cells.jsonl"


@dataclass(kw_only=True)
class RankResult:
    """What one rank reported (or what the launcher learned about it) for one cell."""

    rank: int
    """Global rank."""
    status: str
    """ok / error / hang / crash / skipped."""
    error_type: Optional[str] = None
    """Exception class name, qualified by module unless it is a builtin."""
    error_message: Optional[str] = None
    """str(exception), whole."""
    location: Optional[str] = None
    """``module.function`` of the innermost frame of the raising traceback."""
    traceback: Optional[str] = None
    """Formatted traceback of the error on this rank."""
    stack: Optional[str] = None
    """faulthandler dump of every thread, taken when the cell hung."""
    exit_code: Optional[int] = None
    """Process exit code; negative is the signal number that killed it."""
    signal: Optional[str] = None
    """Signal name when the rank was killed by a signal."""
    checks: Dict[str, Any] = field(default_factory=dict)
    """Post-training checks and their measured values."""
    duration_s: Optional[float] = None
    """Time this rank spent in the cell."""

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> RankResult:
        return cls(**data)


@dataclass(kw_only=True)
class Observed:
    """The cell's outcome across ranks."""

    status: str
    """ok / error / hang / crash / skipped / env-error."""
    error_type: Optional[str] = None
    """The first erroring rank's exception type."""
    error_message: Optional[str] = None
    """Its message."""
    location: Optional[str] = None
    """Its raising ``module.function``."""
    checks: Dict[str, Any] = field(default_factory=dict)
    """Rank 0's checks (values are already reduced across ranks)."""
    ranks: List[RankResult] = field(default_factory=list)
    """Every rank's own result, tracebacks and stacks included."""
    detect_s: Optional[float] = None
    """For hang / crash / one-rank errors: seconds from the first sign of trouble to the launcher's verdict."""
    note: str = ""
    """What the launcher did about it, e.g. why the launch was replaced after this cell."""


@dataclass(kw_only=True)
class Record:
    """One line of cells.jsonl."""

    case: str
    """Case id."""
    cell: str
    """Cell id, e.g. ``dora-bf16-orig1-peft_policy-llama-ws2``."""
    params: Dict[str, Any]
    """The cell's axis values."""
    versions: Dict[str, Optional[str]]
    """Installed torch, peft, transformers, accelerate, bitsandbytes (None when absent), python."""
    device: str
    """cpu or cuda."""
    world_size: int
    """Ranks in the launch."""
    expected: Dict[str, Any]
    """The matching rule's outcome (see Expected)."""
    observed: Observed
    """What happened."""
    verdict: str
    """One of Verdict's values."""
    duration_s: float
    """Wall time of the cell, as the launcher saw it."""
    line: str = ""
    """``expected ... / observed ...``."""
    combo: Optional[str] = None
    """matrix.yaml combo id, when run under nox; None for a plain pytest run."""
    run_id: Optional[str] = None
    """Identifies one pytest/matrix invocation."""
    host: str = field(default_factory=socket.gethostname)
    """Machine that ran it."""
    finished_at: float = field(default_factory=time.time)
    """Unix time the record was written."""
    schema: int = SCHEMA
    """Record format version."""

    @property
    def key(self) -> str:
        return f"{self.case}/{self.cell}"

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> Record:
        data = dict(data)
        obs = dict(data.pop("observed"))
        obs["ranks"] = [RankResult.from_json(r) for r in obs.get("ranks", [])]
        known = set(cls.__dataclass_fields__)
        return cls(observed=Observed(**obs), **{k: v for k, v in data.items() if k in known})


def env_error(message: str, error_type: str = "EnvError") -> Observed:
    """The one outcome of a cell that could not run because its env could not be built, imported, verified or
    launched: the installer's (or torchrun's) reason is the message."""
    rank = RankResult(rank=-1, status="env-error", error_type=error_type, error_message=message)
    return Observed(status="env-error", error_type=error_type, error_message=message, ranks=[rank])


def append(results: Path, record: Record) -> None:
    results.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record.to_json(), sort_keys=True, default=str) + "\n"
    with FileLock(str(results / (RECORDS_FILE + ".lock"))):
        with open(results / RECORDS_FILE, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


def iter_records(path: Path) -> Iterator[Record]:
    """Records of one cells.jsonl, or of every cells.jsonl under a directory."""
    files = [path] if path.is_file() else sorted(path.rglob(RECORDS_FILE))
    for file in files:
        with open(file, encoding="utf-8") as fh:
            for number, text in enumerate(fh, 1):
                if not text.strip():
                    continue
                try:
                    yield Record.from_json(json.loads(text))
                except (json.JSONDecodeError, TypeError, KeyError) as exc:
                    if text.endswith("\n"):
                        raise ValueError(f"{file}:{number}: not a cell record: {exc}") from None
                    # a torn final line from a killed run: the cell has no record and will be re-run on --resume


def latest(records: Iterator[Record]) -> Dict[Tuple[Optional[str], str], Record]:
    """The newest record per (combo, case/cell); re-runs supersede older lines instead of duplicating them."""
    out: Dict[Tuple[Optional[str], str], Record] = {}
    for rec in records:
        key = (rec.combo, rec.key)
        if key not in out or rec.finished_at >= out[key].finished_at:
            out[key] = rec
    return out
