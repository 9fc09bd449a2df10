"""The one Runner of ``bisect`` and ``upgrade``: cells run with ``<venv>/bin/python -m fsdp_matrix run`` in a step's
env, on one batched launch, streamed, and read back from the records it appends.

``LaunchRunner`` answers several cells at once (a CellsRunner, what ``upgrade`` and the nightly use). With
``resume`` (the default) each env's records go to a results dir named by the env and by a fingerprint of what
decides a verdict (matrix.yaml, the repros, the workload), and the run resumes from it: an env whose cells already
ran is not run again. Without it every launch gets a fresh results dir under ``cache/runs``. With ``bare``, what a
release bisect compares: outcomes without their verdicts, and a skipped cell untestable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from fsdp_matrix.bisect.installers import bytecode_on_import, harness_root
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.search import CellOutcome, Untestable
from fsdp_matrix.clip import clip
from fsdp_matrix.options import LaunchOptions, to_argv
from fsdp_matrix.records import RECORDS_FILE, Record, iter_records, latest
from fsdp_matrix.runner import procs
from fsdp_matrix.verdicts import Verdict

_VERDICTS = tuple(v.value for v in Verdict)


def fingerprint(matrix: Optional[Path] = None) -> str:
    """Hash of what decides a cell's verdict besides the env: matrix.yaml, repros/ and fsdp_matrix/workload/."""
    root = harness_root()
    files = [matrix or root / "matrix.yaml", *sorted((root / "repros").glob("*.py"))]
    files += sorted((root / "fsdp_matrix" / "workload").glob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def outcome_of(rec: Record) -> CellOutcome:
    obs = rec.observed
    if obs.status == "env-error":
        return Untestable(f"env-error: {clip(obs.error_message or '', 200)}")
    return Outcome.observed(obs.status, obs.error_type, obs.error_message, rec.verdict)


@dataclass
class Launched:
    """What one ask for cells found: their records, and how the launch (if one was needed) ended."""

    records: Dict[str, Record]
    """Cell key -> its newest record in the env's results."""
    tail: str = ""
    """The last lines of the launch's output."""
    exit_code: Optional[int] = None
    """The run command's exit status; None when every cell was already recorded."""
    timed_out: bool = False
    """The backstop timeout killed the launch."""


class LaunchRunner:
    """Runs cells with ``<venv>/bin/python -m fsdp_matrix run CELL ... --resume`` and reads back their records."""

    def __init__(
        self,
        cache: Path,
        *,
        matrix: Optional[Path] = None,
        device: str = "cpu",
        world_size: int = 2,
        timeout: float = 3600,
        resume: bool = True,
        say: Callable[[str], None] = print,
        status: Callable[[str], None] = lambda text: None,
        label: Callable[[str], str] = str,
        bare: bool = False,
    ) -> None:
        self.cache, self.matrix, self.device, self.world_size = cache, matrix, device, world_size
        self.timeout, self.resume, self.say, self.status, self.label = timeout, resume, say, status, label
        self.bare = bare
        """Outcomes without verdicts (a release bisect compares what the cell did, not what the rules expected at
        each release), and a skipped cell untestable."""
        self._key: Optional[str] = None
        self._fresh: Dict[Path, Path] = {}
        self.launches = 0
        """Launches started (a resumed run whose cells all have records still counts: it costs a start-up)."""

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = fingerprint(self.matrix)
        return self._key

    def results_dir(self, venv: Path) -> Path:
        if self.resume:
            return self.cache / "results" / f"{venv.name}-{self.key}"
        # each launch's results and logs stay under the cache, for a look at a surprising step
        if venv not in self._fresh:
            (self.cache / "runs").mkdir(parents=True, exist_ok=True)
            self._fresh[venv] = Path(tempfile.mkdtemp(prefix="bisect-", dir=self.cache / "runs"))
        return self._fresh[venv]

    def command(self, venv: Path, cells: Sequence[str]) -> List[str]:
        opts = LaunchOptions(
            results=self.results_dir(venv),
            device=self.device,
            world_size=self.world_size,
            combo=venv.name,
            resume=True,
            matrix=self.matrix,
        )
        names = ("results", "device", "world_size", "combo", "resume", "matrix")
        # the ids go in a file: 80,000 of them on the command line passed the kernel's limit (E2BIG)
        opts.results.mkdir(parents=True, exist_ok=True)
        fd, listed = tempfile.mkstemp(prefix="cells-", suffix=".txt", dir=opts.results)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{cell}\n" for cell in cells))
        python = str(venv / "bin" / "python")
        return [python, "-m", "fsdp_matrix", "run", "--cells-file", listed, *to_argv(opts, names)]

    def recorded(self, venv: Path) -> Dict[str, Record]:
        path = self.results_dir(venv) / RECORDS_FILE
        if not path.exists():
            return {}
        return {key: rec for (combo, key), rec in latest(iter_records(path)).items() if combo == venv.name}

    def launch(self, env: Path, candidate: str, cells: Sequence[str]) -> Launched:
        """Run the cells of ``cells`` that have no record in ``env`` yet, and return every one's record."""
        if not self.resume:
            self._fresh.pop(env, None)
        done = self.recorded(env)
        todo = [c for c in cells if c not in done]
        label = self.label(candidate)
        if not todo:
            self.say(f"{label}: all {len(cells)} cells already recorded in {self.results_dir(env)}")
            return Launched(done)
        self.say(f"{label}: running {len(todo)} cells in one launch ({len(cells) - len(todo)} already recorded)")
        launched = self._launch(env, todo, label, len(cells) - len(todo), len(cells))
        launched.records = self.recorded(env)
        return launched

    def run_cells(self, env: Path, candidate: str, cells: Sequence[str]) -> Mapping[str, CellOutcome]:
        got = self.launch(env, candidate, cells)
        if cells and not any(c in got.records for c in cells):
            raise Untestable(_no_record(cells, got, self.timeout))
        return {c: self._outcome(got.records[c]) for c in cells if c in got.records}

    def _outcome(self, rec: Record) -> CellOutcome:
        if not self.bare:
            return outcome_of(rec)
        obs = rec.observed
        if obs.status in ("skipped", "env-error"):
            return Untestable(f"{obs.status}: {obs.error_message or obs.error_type or ''}".strip())
        return dataclasses.replace(outcome_of(rec), verdict=None)

    def _launch(self, venv: Path, cells: Sequence[str], label: str, already: int, total: int) -> Launched:
        self.launches += 1
        results = self.results_dir(venv)
        argv = self.command(venv, cells)
        try:
            return self._supervise(argv, results, label, already, total)
        finally:
            Path(argv[argv.index("--cells-file") + 1]).unlink(missing_ok=True)

    def _supervise(self, argv: List[str], results: Path, label: str, already: int, total: int) -> Launched:
        lines: List[str] = []
        with bytecode_on_import():
            # own session: on the backstop timeout the whole launch (torchrun and its ranks) is killed
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )
        # the run command bounds each cell itself; this is the backstop when it does not
        fired = threading.Event()

        def backstop() -> None:
            fired.set()
            _kill_launch(proc, results)

        watchdog = threading.Timer(self.timeout, backstop)
        watchdog.daemon = True
        watchdog.start()
        count = already
        self.status(f"{label}: launch starting, {count}/{total} cells done")
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip())
                words = line.split()
                if words and words[0] in _VERDICTS:
                    count += 1
                    self.say(f"{label}: {count}/{total} {words[0]} {words[1] if len(words) > 1 else ''}")
                    self.status(f"{label}: launch running, {count}/{total} cells done")
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                _kill_launch(proc, results)
                proc.wait()
        return Launched({}, clip("\n".join(lines), lines=15, tail=True), proc.returncode, fired.is_set())


def _no_record(cells: Sequence[str], got: Launched, timeout: float) -> str:
    which = cells[0] if len(cells) == 1 else "any cell"
    if got.timed_out:
        # the harness's own backstop says nothing about the cell; the run command bounds a real hang itself
        return f"no record for {which}: the backstop --timeout ran out (--timeout ({timeout:g}s) ran out first)"
    return f"no record for {which} (exit {got.exit_code}): {got.tail}"


def _kill_launch(proc: subprocess.Popen, results: Path) -> None:
    # torchrun runs in a session of its own, out of reach of killpg: its launches are found by their directories'
    # markers instead (the launch's watchdog would take them down too, but the backstop does not wait for it)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    procs.kill_all(procs.marked(procs.launch_ids_under(results)))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is: it takes Ctrl-C's path, so every ``finally`` that ends a launch
    runs (``LaunchRunner._launch``)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def stopped_by_signal(prog: str, run: Callable[[], int]) -> int:
    """``run()``, with Ctrl-C and SIGTERM ending the running launch and the command in one line (exit 130 / 143)
    instead of a traceback, or of a launch left running unsupervised."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return run()
    except KeyboardInterrupt as exc:
        what, code = ("terminated (SIGTERM)", 143) if isinstance(exc, Terminated) else ("interrupted (Ctrl-C)", 130)
        print(f"{prog}: {what}; the running launch was stopped (the cache keeps every finished step)", file=sys.stderr)
        return code
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
