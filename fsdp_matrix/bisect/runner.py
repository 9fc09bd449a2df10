"""The Runner of a bisection: one cell run with ``python -m fsdp_matrix run`` in a step's env, read back as an
Outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional

from fsdp_matrix.bisect.installers import bytecode_on_import
from fsdp_matrix.bisect.search import Outcome, Untestable
from fsdp_matrix.clip import clip
from fsdp_matrix.records import RECORDS_FILE, iter_records
from fsdp_matrix.runner import procs


class CellRunner:
    """Runs one cell with ``<venv>/bin/python -m fsdp_matrix run`` and reads the Record it appends."""

    def __init__(
        self,
        cell: str,
        device: str = "cpu",
        world_size: int = 2,
        matrix: Optional[Path] = None,
        timeout: float = 900,
        workdir: Optional[Path] = None,
    ) -> None:
        self.cell, self.device, self.world_size, self.matrix = cell, device, world_size, matrix
        self.timeout, self.workdir = timeout, workdir

    def command(self, venv: Path, results: Path) -> List[str]:
        cmd = [
            str(venv / "bin" / "python"),
            "-m",
            "fsdp_matrix",
            "run",
            self.cell,
            "--results",
            str(results),
            "--device",
            self.device,
            "--world-size",
            str(self.world_size),
        ]
        return cmd + (["--matrix", str(self.matrix)] if self.matrix else [])

    def run(self, env: Path, candidate: str) -> Outcome:
        results = Path(tempfile.mkdtemp(prefix="bisect-", dir=self.workdir))
        with bytecode_on_import():
            # own session: on the backstop timeout the whole launch (torchrun and its ranks) is killed, not just
            # the top process, whose orphaned ranks would keep the pipes open and block forever
            proc = subprocess.Popen(
                self.command(env, results),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            # the run command bounds hangs itself; this is the backstop when it does not. torchrun runs in a session
            # of its own, out of reach of killpg: its launches are found by their directories' markers instead
            # (the launch's watchdog would take them down too, but the backstop does not wait for it)
            os.killpg(proc.pid, signal.SIGKILL)
            procs.kill_all(procs.marked(procs.launch_ids_under(results)))
            proc.communicate()
            return Outcome("hang")
        records = list(iter_records(results / RECORDS_FILE)) if (results / RECORDS_FILE).exists() else []
        mine = [r for r in records if self.cell in (r.key, r.cell)]
        if not mine:
            tail = clip((stderr + stdout).strip(), lines=15, tail=True)
            raise Untestable(f"no record for {self.cell} (exit {proc.returncode}): {tail}")
        obs = mine[-1].observed
        if obs.status in ("skipped", "env-error"):
            raise Untestable(f"{obs.status}: {obs.error_message or obs.error_type or ''}".strip())
        return Outcome.observed(obs.status, obs.error_type, obs.error_message)
