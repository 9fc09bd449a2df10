"""A CellsRunner: several cells on one batched launch (``python -m fsdp_matrix run``) in a step's env, streamed.

Each env's records go to a results dir named by the env and by a fingerprint of what decides a verdict (matrix.yaml,
the repros, the workload), and the run resumes from it: an env whose cells already ran is not run again.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from fsdp_matrix.bisect.installers import bytecode_on_import, harness_root
from fsdp_matrix.bisect.search import CellOutcome, Outcome, Untestable
from fsdp_matrix.clip import clip
from fsdp_matrix.records import RECORDS_FILE, Record, iter_records, latest
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
        say: Callable[[str], None] = print,
        status: Callable[[str], None] = lambda text: None,
        label: Callable[[str], str] = str,
    ) -> None:
        self.cache, self.matrix, self.device, self.world_size = cache, matrix, device, world_size
        self.timeout, self.say, self.status, self.label = timeout, say, status, label
        self.key = fingerprint(matrix)
        self.launches = 0
        """Launches started (a resumed run whose cells all have records still counts: it costs a start-up)."""

    def results_dir(self, venv: Path) -> Path:
        return self.cache / "results" / f"{venv.name}-{self.key}"

    def command(self, venv: Path, cells: Sequence[str]) -> List[str]:
        cmd = [str(venv / "bin" / "python"), "-m", "fsdp_matrix", "run", *cells]
        cmd += ["--results", str(self.results_dir(venv)), "--device", self.device]
        cmd += ["--world-size", str(self.world_size), "--combo", venv.name, "--resume"]
        return cmd + (["--matrix", str(self.matrix)] if self.matrix else [])

    def recorded(self, venv: Path) -> Dict[str, Record]:
        path = self.results_dir(venv) / RECORDS_FILE
        if not path.exists():
            return {}
        return {key: rec for (combo, key), rec in latest(iter_records(path)).items() if combo == venv.name}

    def run_cells(self, env: Path, candidate: str, cells: Sequence[str]) -> Mapping[str, CellOutcome]:
        done = self.recorded(env)
        todo = [c for c in cells if c not in done]
        label = self.label(candidate)
        if todo:
            self.say(f"{label}: running {len(todo)} cells in one launch ({len(cells) - len(todo)} already recorded)")
            tail = self._launch(env, todo, label, len(cells) - len(todo), len(cells))
            done = self.recorded(env)
        else:
            tail = ""
            self.say(f"{label}: all {len(cells)} cells already recorded in {self.results_dir(env)}")
        missing = [c for c in cells if c not in done]
        if missing and len(missing) == len(cells):
            raise Untestable(f"no record for any cell: {tail}")
        return {c: outcome_of(done[c]) for c in cells if c in done}

    def _launch(self, venv: Path, cells: Sequence[str], label: str, already: int, total: int) -> str:
        self.launches += 1
        lines: List[str] = []
        with bytecode_on_import():
            # own session: on the backstop timeout the whole launch (torchrun and its ranks) is killed
            proc = subprocess.Popen(
                self.command(venv, cells),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )
        # the run command bounds each cell itself; this is the backstop when it does not
        watchdog = threading.Timer(self.timeout, _kill_group, args=(proc,))
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
                _kill_group(proc)
                proc.wait()
        return clip("\n".join(lines), lines=15, tail=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
