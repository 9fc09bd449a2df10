"""Records: one JSON line per cell in ``<results>/cells.jsonl``, appended the moment the cell ends.

The file is shared by xdist workers and by concurrent runs, so each append takes a lock and writes one whole line,
starting on a fresh line even when a killed writer left a torn one. Readers validate every line with pydantic and
skip a line that is not a record (torn, wrong-typed), counting and reporting it, instead of failing the whole file.
Unknown fields are ignored, so an older reader reads a newer harness's records.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from filelock import FileLock
from pydantic import ConfigDict, TypeAdapter, ValidationError

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import MatrixError, ResultsError

SCHEMA = 6
"""6: ``harness`` (the harness version that judged the cell) and ``requires`` (the case's requirements it was judged
under): ``--resume`` keeps only records of this harness, and a skip only while its reason still holds.
5: ``confirmation`` (the nightly's reruns of a cell whose verdict flipped: confirmed, or flaky).
4: ``nodes`` (``world_size`` is the global world size, over every node), ``versions.trl`` (TRL, None where the
env has none), ``RankResult.warnings`` (the warnings each rank's run() raised; rules may expect one, or its absence).
3: ``Observed.env_removed`` (the caller's variables kept from the ranks). 2: ``sources`` (packages built from a git
ref or a checkout). 1: none of these. Older records read as before (the new fields default to empty, and ``nodes``
to 1)."""
RECORDS_FILE = "cells.jsonl"
MIN_FREE_BYTES = 1 << 20
"""Free space the results file's device must have when a run starts (a clipped record is at most ~0.3 MB)."""
MESSAGE_CHARS = 8_000
"""What a record keeps of an error message, head and tail (the verdict is judged on the whole message first)."""
TEXT_CHARS = 64_000
"""What a record keeps of a rank's traceback or stack dump, head and tail."""


@dataclass(kw_only=True)
class RankResult:
    """What one rank reported (or what the launcher learned about it) for one cell."""

    __pydantic_config__ = ConfigDict(strict=True)  # a record's "1.5" is not a number: that line was not ours

    rank: int
    """Global rank."""
    status: str
    """ok / error / hang / crash / skipped, or stopped: torchrun ended it because another rank died."""
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
    warnings: List[Dict[str, Any]] = field(default_factory=list)
    """The Python warnings run() raised on this rank, once per (category, message) in the order first raised:
    ``{category, message, filename, lineno, count}`` (schema 4; empty in older records)."""

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> RankResult:
        return _adapter(cls).validate_python(data, strict=False)


@dataclass(kw_only=True)
class Observed:
    """The cell's outcome across ranks."""

    __pydantic_config__ = ConfigDict(strict=True)

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
    env_removed: List[str] = field(default_factory=list)
    """The caller's environment variables the ranks were started without (they steer accelerate's and
    transformers' FSDP choices; see runner/protocol.py STRIPPED_ENV_PREFIXES)."""


@dataclass(kw_only=True)
class Confirmation:
    """What the reruns of a flipped cell said before the flip could count (fsdp_matrix/confirm.py)."""

    __pydantic_config__ = ConfigDict(strict=True)

    status: str
    """confirmed (every rerun repeated the flip), flaky (one did not: no alert, no bisect), not-the-sources (it
    repeats at last night's commits too: the moved sources did not cause it), or unconfirmed (no rerun ran)."""
    previous: Optional[str] = None
    """The verdict the previous night recorded for this cell (None: no record)."""
    reruns: List[Optional[str]] = field(default_factory=list)
    """The verdict of each rerun in tonight's env, each in a fresh launch (None: the rerun left no record)."""
    at_previous: List[Optional[str]] = field(default_factory=list)
    """The verdict of each rerun at last night's commits, when the sources moved (empty otherwise)."""


@dataclass(kw_only=True)
class Record:
    """One line of cells.jsonl."""

    __pydantic_config__ = ConfigDict(strict=True)

    case: str
    """Case id."""
    cell: str
    """Cell id, e.g. ``dora-bf16-orig1-peft_policy-llama-ws2``."""
    params: Dict[str, Any]
    """The cell's axis values."""
    versions: Dict[str, Optional[str]]
    """Installed torch, peft, transformers, accelerate, bitsandbytes, trl (None when absent), python."""
    device: str
    """cpu or cuda."""
    world_size: int
    """Ranks in the process group, over every node (the global world size the cell ran at)."""
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
    sources: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    """Packages built from source instead of a release: ``{pkg: {url, ref, commit, dirty, release}}``. ``versions``
    still holds the installed version string; ``release`` is the release tag the rules judged the build as."""
    nodes: int = 1
    """Nodes the ranks were spread over (schema 4; an older record ran on one)."""
    confirmation: Optional[Confirmation] = None
    """The nightly's reruns of this cell when its verdict flipped since the previous night (schema 5; None: not a
    flip, or not rerun). The nightly appends a copy of tonight's record with it filled in."""
    harness: str = ""
    """The harness that judged the cell: the record schema and a digest of the code that runs and judges a cell
    (``runner.session.harness_version``; schema 6, empty before). ``--resume`` keeps only records of the running
    harness: a newer one judges with more checks."""
    requires: List[Dict[str, Any]] = field(default_factory=list)
    """The case's ``requires`` entries (matrix.yaml) that apply to this cell, as it was judged under them (schema 6;
    empty where none apply, and in older records). A skip's reason is ``observed.error_message``."""
    schema: int = SCHEMA
    """Record format version."""

    @property
    def key(self) -> str:
        return f"{self.case}/{self.cell}"

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> Record:
        return _adapter(cls).validate_python(data, strict=False)


@cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


@dataclass(frozen=True)
class Skipped:
    """A line of cells.jsonl that is not a cell record: left out of what is read, and said so."""

    file: Path
    """The cells.jsonl it is in."""
    line: int
    """1-based line number."""
    reason: str
    """Which field is wrong and how, or why it is not JSON."""
    torn: bool = False
    """The file's last line, without its newline: a writer killed mid-write (or one still writing)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: skipped: {self.reason}"


def env_error(message: str, error_type: str = "EnvError") -> Observed:
    """The one outcome of a cell that could not run because its env could not be built, imported, verified or
    launched: the installer's (or torchrun's) reason is the message."""
    rank = RankResult(rank=-1, status="env-error", error_type=error_type, error_message=message)
    return Observed(status="env-error", error_type=error_type, error_message=message, ranks=[rank])


def _short(text: Optional[str], chars: int) -> Optional[str]:
    return text if text is None or len(text) <= chars else clip(text, chars, middle=True)


def _oversized(rec: Record) -> bool:
    """A record holding more text than the harness writes (a line from elsewhere): readers clip it as the writer
    would, or one line of megabytes becomes megabytes in every report, JUnit file and diff."""
    obs = rec.observed
    if len(rec.line) > MESSAGE_CHARS or len(obs.error_message or "") > MESSAGE_CHARS:
        return True
    return any(
        len(r.error_message or "") > MESSAGE_CHARS
        or len(r.traceback or "") > TEXT_CHARS
        or len(r.stack or "") > TEXT_CHARS
        for r in obs.ranks
    )


def clipped(observed: Observed) -> Observed:
    """``observed`` with every error message, traceback and stack cut to its head and tail (MESSAGE_CHARS,
    TEXT_CHARS): a cell that raises with megabytes of text gets a record line of kilobytes, not one copy per rank."""

    ranks = [
        replace(
            r,
            error_message=_short(r.error_message, MESSAGE_CHARS),
            traceback=_short(r.traceback, TEXT_CHARS),
            stack=_short(r.stack, TEXT_CHARS),
        )
        for r in observed.ranks
    ]
    return replace(observed, error_message=_short(observed.error_message, MESSAGE_CHARS), ranks=ranks)


def check_appendable(results: Path) -> None:
    """Raise ResultsError (one line naming the file) unless records can be appended to ``results/cells.jsonl``:
    the directory and the file can be created, the file opened for appending and its lock taken, and its device
    has MIN_FREE_BYTES free. Called once before a run's first launch, so that no cell runs to lose its verdict."""
    file = results / RECORDS_FILE
    try:
        results.mkdir(parents=True, exist_ok=True)
        with FileLock(str(results / (RECORDS_FILE + ".lock"))):
            with open(file, "ab"):
                pass
        st = os.statvfs(results)
    except OSError as exc:
        raise ResultsError(f"cannot append records to {file}: {exc.strerror or exc}") from None
    if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
        free = st.f_bavail * st.f_frsize
        raise ResultsError(f"cannot append records to {file}: no space left on its device ({free:,} bytes free)")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match) -> str:
    code = ord(match.group())
    # os.fsdecode / surrogateescape map an undecodable byte 0xNN to U+DCNN: show it as the byte it was
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def lossless(value: Any) -> Any:
    """``value`` with every lone surrogate of its strings (keys included) written as backslash text (``\\xff`` for
    a surrogate-escaped byte): what UTF-8 and pydantic's JSON reader both take, so every record written reads back."""
    if isinstance(value, str):
        return _SURROGATE.sub(_escape_surrogate, value)
    if isinstance(value, dict):
        return {lossless(k): lossless(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [lossless(v) for v in value]
    return value


def append(results: Path, record: Record) -> None:
    results.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(lossless(record.to_json()), sort_keys=True, default=str) + "\n").encode("utf-8")
    with FileLock(str(results / (RECORDS_FILE + ".lock"))):
        with open(results / RECORDS_FILE, "ab+") as fh:
            end = fh.seek(0, os.SEEK_END)
            if end:
                fh.seek(end - 1)
                if fh.read(1) != b"\n":
                    # a writer killed mid-line left a fragment: end it, or this record would be glued onto it
                    line = b"\n" + line
            fh.write(line)  # append mode: always at the end, wherever the read left the position
            fh.flush()
            os.fsync(fh.fileno())


SkipSink = Union[List[Skipped], Callable[[Skipped], None], None]
"""Where ``iter_records`` puts the lines it skips: a list to collect them, a callable, or None for stderr."""


def iter_records(path: Path, skipped: SkipSink = None) -> Iterator[Record]:
    """Records of one cells.jsonl, or of every cells.jsonl under a directory.

    A line that is not a valid record is skipped and handed to ``skipped`` (see SkipSink); none is dropped unsaid.
    """
    report = skipped.append if isinstance(skipped, list) else skipped or _to_stderr
    files = [path] if path.is_file() else sorted(path.rglob(RECORDS_FILE))
    adapter = _adapter(Record)
    for file in files:
        newer: Dict[int, int] = {}
        with open(file, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    rec = _parse(adapter, raw.rstrip(b"\r\n"))
                except ValidationError as exc:
                    report(Skipped(file, number, _reason(exc), torn=not raw.endswith(b"\n")))
                    continue
                if _oversized(rec):
                    rec = replace(rec, line=_short(rec.line, MESSAGE_CHARS), observed=clipped(rec.observed))
                if rec.schema > SCHEMA:
                    newer[rec.schema] = newer.get(rec.schema, 0) + 1
                yield rec
        if newer:
            _say_newer(file, newer)


def _say_newer(file: Path, newer: Dict[int, int]) -> None:
    # a newer harness's records read here lose what they hold beyond this reader's schema: say so, once per file
    count, schemas = sum(newer.values()), ", ".join(str(s) for s in sorted(newer))
    what = f"{count} record{'s' if count > 1 else ''} of schema {schemas}"
    print(
        f"fsdp-matrix: {file}: {what}, newer than this reader (schema {SCHEMA}): read without the fields it does "
        "not know",
        file=sys.stderr,
    )


def _parse(adapter: TypeAdapter, raw: bytes) -> Record:
    """One line as a record. pydantic's JSON parser refuses a lone surrogate escape (``"\\udcff"``), which an
    older harness's json.dumps wrote for a non-UTF-8 path byte: such a line is read by json and made lossless."""
    try:
        return adapter.validate_json(raw)
    except ValidationError as exc:
        if b"\\ud" not in raw.lower() or exc.errors(include_url=False)[0]["type"] != "json_invalid":
            raise
        try:
            data = json.loads(raw)
        except ValueError:
            raise exc from None
        return adapter.validate_json(json.dumps(lossless(data)))


def read_all(path: Path, what: str = "--results") -> List[Record]:
    """Every record of ``path`` (see iter_records). MatrixError (one line, naming ``what``) when it has lines and not
    one is a record: a wrong path (a matrix.yaml, a log), not a results file that lacks the cell asked about."""
    skipped: List[Skipped] = []
    out = list(iter_records(path, skipped))
    if skipped and not out:
        first = clip(skipped[0].reason, 120, flat=True)
        raise MatrixError(f"{what}: {path}: not a results file ({len(skipped)} lines, none a record: {first})")
    return out


def _reason(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    if first["type"] == "json_invalid":
        return f"not JSON: {first['msg'].removeprefix('Invalid JSON: ')}"
    where = ".".join(str(p) for p in first["loc"]) or "<line>"
    return f"{where}: {first['msg']}{more}"


def _to_stderr(skip: Skipped) -> None:
    print(f"fsdp-matrix: {skip}", file=sys.stderr)


def recorded_version(rec: Record, name: str) -> str:
    """The version of ``name`` that ``rec`` ran, with a source build's commit (``0.20.1.dev0 @ 5d602fd``)."""
    version = rec.versions.get(name) or "-"
    built = rec.sources.get(name) or {}
    if built.get("commit"):
        version += f" @ {built['commit'][:7]}" + ("+dirty" if built.get("dirty") else "")
    return version


def off_pins(rec: Record, pins: Mapping[str, Optional[str]]) -> List[str]:
    """``NAME VERSION`` of each pinned package that ``rec`` ran at another version (a local label such as ``+cpu``
    aside) or built from source: a record of the same combo id may come from older pins."""
    out = []
    for name, pin in pins.items():
        got = rec.versions.get(name)
        if pin and got and (got.split("+")[0] != pin or name in rec.sources):
            out.append(f"{name} {recorded_version(rec, name)}")
    return out


def latest(records: Iterator[Record]) -> Dict[Tuple[Optional[str], str], Record]:
    """The newest record per (combo, case/cell); re-runs supersede older lines instead of duplicating them."""
    out: Dict[Tuple[Optional[str], str], Record] = {}
    for rec in records:
        key = (rec.combo, rec.key)
        if key not in out or rec.finished_at >= out[key].finished_at:
            out[key] = rec
    return out
