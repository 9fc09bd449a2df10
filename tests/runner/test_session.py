"""Resume after SIGKILL of the whole run, and concurrent runs sharing one results dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fsdp_matrix import records
from fsdp_matrix.runner import procs

HERE = Path(__file__).resolve().parent
CELLS = [f"healthy/fault_ok-n{i}-sleep1-ws2" for i in range(1, 7)]


def _run(results: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "fsdp_matrix",
        "run",
        "--matrix",
        str(HERE / "fault_matrix.yaml"),
        "--results",
        str(results),
        "--combo",
        "local",
        *extra,
        *CELLS,
    ]
    return subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _lines(results: Path) -> int:
    path = results / records.RECORDS_FILE
    return path.read_text().count("\n") if path.exists() else 0


def _launch_ids(results: Path) -> set:
    """The marker values of this test's own launches (other tests' launchers may legitimately be running)."""
    return {d.name.rsplit("-", 1)[-1] for d in (results / "launches").glob("*/launch-*")}


def _none_alive(launch_ids: set, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        alive = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(procs.MARKER) in launch_ids:
                    alive.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        if not alive:
            return True
        time.sleep(0.5)
    return False


def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path):
    first = _run(tmp_path)
    deadline = time.monotonic() + 240
    while _lines(tmp_path) < 2 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)  # the whole run, as an OOM killer or a cancelled CI job would
    first.wait()
    kept = list(records.iter_records(tmp_path))
    assert 2 <= len(kept) < len(CELLS)
    # ranks notice their coordinator is gone and exit: nothing of that run is left running
    ids = _launch_ids(tmp_path)
    assert ids and _none_alive(ids, 60)

    second = _run(tmp_path, "--resume")
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    final = list(records.iter_records(tmp_path))
    assert sorted(r.key for r in final) == sorted(CELLS)  # every cell once: none lost, none duplicated
    assert [r for r in final if r.run_id == kept[0].run_id] == kept  # the first run's records are untouched
    assert all(r.verdict == "fix-holds" for r in final)


def test_two_runs_at_once_share_a_results_dir_without_collision(tmp_path):
    a, b = _run(tmp_path), _run(tmp_path)
    outs = [p.communicate(timeout=300)[0] for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, outs
    final = list(records.iter_records(tmp_path))
    assert len(final) == 2 * len(CELLS) and len({r.run_id for r in final}) == 2
    assert all(r.verdict == "fix-holds" for r in final)
