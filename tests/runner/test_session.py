"""Resume after SIGKILL of the whole run, and concurrent runs sharing one results dir."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fsdp_matrix import records
from fsdp_matrix.runner import procs
from tests.helpers import wait_for_rank1_start

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


@pytest.mark.heavy  # nox -s heavy: a long end-to-end run
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


@pytest.mark.heavy  # nox -s heavy: a long end-to-end run
def test_two_runs_at_once_share_a_results_dir_without_collision(tmp_path):
    a, b = _run(tmp_path), _run(tmp_path)
    outs = [p.communicate(timeout=300)[0] for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, outs
    final = list(records.iter_records(tmp_path))
    assert len(final) == 2 * len(CELLS) and len({r.run_id for r in final}) == 2
    assert all(r.verdict == "fix-holds" for r in final)


# ---- what --resume re-runs -----------------------------------------------------------------------------


class _CountingLauncher:
    """Stands in for the launcher: every cell it is asked to run is ok, and it remembers which it was asked."""

    def __init__(self):
        self.ran = []

    def submit(self, task):
        if task.key not in self.ran:
            self.ran.append(task.key)

    def wait(self, key):
        from fsdp_matrix.records import RankResult
        from fsdp_matrix.runner.watching import CellRun

        return CellRun(key=key, status="ok", ranks=[RankResult(rank=0, status="ok", checks={"sum": 1})], duration_s=0.1)

    def close(self):
        pass


def _session(results, combo="local", versions=None, resume=True, launcher=None):
    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.runner.session import Session

    launcher = launcher or _CountingLauncher()
    session = Session(
        load_matrix(HERE / "fault_matrix.yaml"),
        launcher,
        results,
        versions or {"torch": "2.13.0", "peft": "0.21.2"},
        combo=combo,
        resume=resume,
        repo_root=HERE,
    )
    return session, launcher


def _healthy_cells(device="cpu"):
    from fsdp_matrix.cells import expand
    from fsdp_matrix.matrix import load_matrix

    return expand(load_matrix(HERE / "fault_matrix.yaml"), device, 2, ["healthy"])


def _earlier(results, cell, verdict, status, combo="local", versions=None, device="cpu", sources=None, expected=None):
    """A record this harness wrote earlier (its version stamped, as Session stamps it)."""
    from fsdp_matrix.records import Observed, Record
    from fsdp_matrix.runner.session import harness_version

    rec = Record(
        case=cell.case,
        cell=cell.id,
        params=cell.params_dict,
        versions=versions or {"torch": "2.13.0", "peft": "0.21.2"},
        device=device,
        world_size=2,
        expected=expected or {"kind": "ok"},
        observed=Observed(status=status, error_message="earlier"),
        verdict=verdict,
        duration_s=1.0,
        combo=combo,
        run_id="earlier",
        sources=sources or {},
        harness=harness_version(),
    )
    records.append(results, rec)


def test_resume_reruns_env_errors_and_cut_off_cells_and_keeps_observations(tmp_path):
    cells = _healthy_cells()
    earlier = [
        ("env-error", "env-error"),  # the env is fixed now: run it
        ("crash", "crash"),  # cut off: the run (or a rank) was killed under it
        ("hang", "hang"),  # cut off at the timeout
        ("fix-holds", "ok"),  # observations of the bug stay
        ("REGRESSION", "error"),
    ]
    for cell, (verdict, status) in zip(cells, earlier):
        _earlier(tmp_path, cell, verdict, status)
    session, launcher = _session(tmp_path)
    session.prefetch(cells)
    got = {c.key: session.run(c).verdict for c in cells}
    assert launcher.ran == [c.key for c in cells[:3]] + [cells[5].key]  # cells[5] had no record at all
    assert got[cells[3].key] == "fix-holds" and got[cells[4].key] == "REGRESSION"
    assert all(got[c.key] == "fix-holds" for c in cells[:3])


def test_resume_without_a_combo_matches_device_and_versions(tmp_path):
    cells = _healthy_cells()
    _earlier(tmp_path, cells[0], "fix-holds", "ok", combo=None)  # same env: kept
    _earlier(tmp_path, cells[1], "fix-holds", "ok", combo=None, versions={"torch": "2.12.0", "peft": "0.21.2"})
    _earlier(tmp_path, cells[2], "fix-holds", "ok", combo=None, device="cuda")
    _earlier(tmp_path, cells[3], "fix-holds", "ok", combo="old")  # another combo's record is not this run's
    session, launcher = _session(tmp_path, combo=None)
    for cell in cells[:4]:
        session.run(cell)
    assert launcher.ran == [c.key for c in cells[1:4]]


def test_resume_reruns_cells_whose_rule_changed_and_keeps_those_whose_citation_did(tmp_path):
    """A rule fixed after a DIFFERENT-ERROR (or a skip lifted) must not leave the old rule's verdict in place: the
    cell runs again. A reworded source, or the rule's index moved by a rule inserted above it, judges alike."""
    cells = _healthy_cells()
    now = {"kind": "ok", "rule": 0, "source": "a healthy cell trains"}  # what fault_matrix.yaml gives these cells
    _earlier(tmp_path, cells[0], "fix-holds", "ok", expected=now)
    _earlier(tmp_path, cells[1], "fix-holds", "ok", expected={**now, "source": "reworded since", "rule": 3})
    old_rule = {"kind": "error", "error_type": "ValueError", "match": "earlier", "rule": 0, "source": "s"}
    _earlier(tmp_path, cells[2], "reproduced", "error", expected=old_rule)
    _earlier(tmp_path, cells[3], "skipped", "skipped", expected={"kind": "skip", "reason": "lifted since"})
    session, launcher = _session(tmp_path)
    session.prefetch(cells[:4])
    got = [session.run(c).verdict for c in cells[:4]]
    assert launcher.ran == [c.key for c in cells[2:4]]
    assert got == ["fix-holds"] * 4


_SRC = {"peft": {"url": "/src/peft", "ref": "main", "commit": "a" * 40, "dirty": None, "release": "0.21.2"}}


def test_resume_under_a_combo_keeps_only_records_of_the_installed_versions_and_sources(tmp_path, monkeypatch):
    """After a pin bump (or a nightly move of the floating combo) the combo id is the same but the env is
    not: a record is kept only when every version it recorded, and its source builds, are what is installed."""
    cells = _healthy_cells()
    env = {"torch": "2.13.0", "peft": "0.21.2", "transformers": "5.23.0", "python": "3.12.3"}
    _earlier(tmp_path, cells[0], "fix-holds", "ok", combo="current", versions=env, sources=_SRC)  # kept
    _earlier(tmp_path, cells[1], "fix-holds", "ok", combo="current", versions={**env, "peft": "0.20.0"})
    _earlier(tmp_path, cells[2], "fix-holds", "ok", combo="current", versions={**env, "transformers": "4.57.6"})
    _earlier(tmp_path, cells[3], "fix-holds", "ok", combo="current", versions=env)  # a release, now a source build
    other = {"peft": {**_SRC["peft"], "commit": "b" * 40}}
    _earlier(tmp_path, cells[4], "fix-holds", "ok", combo="current", versions=env, sources=other)  # another commit
    _earlier(tmp_path, cells[5], "fix-holds", "ok", combo="current", versions={**env, "trl": "0.19.0"})
    from fsdp_matrix.runner import session as session_module

    # this env's peft is a source build (what fsdp_matrix.envs.sources reads from the env's prefix)
    monkeypatch.setattr(session_module, "installed_sources", lambda versions: dict(_SRC))
    session, launcher = _session(tmp_path, combo="current", versions=env)
    for cell in cells:
        session.run(cell)
    assert launcher.ran == [c.key for c in cells[1:]]


# ---- a megabyte error message -------------------------------------------------------------------------


class _HugeErrorLauncher(_CountingLauncher):
    """Every cell raises on both ranks with an 8 MB message (and a traceback that ends with it)."""

    MESSAGE = "HEAD of the message " + "x" * (8 << 20) + " the TAIL"

    def wait(self, key):
        from fsdp_matrix.records import RankResult
        from fsdp_matrix.runner.watching import CellRun

        ranks = [
            RankResult(
                rank=r,
                status="error",
                error_type="ValueError",
                error_message=self.MESSAGE,
                location="repro.run",
                traceback="Traceback (most recent call last):\n  File repro.py, in run\nValueError: " + self.MESSAGE,
            )
            for r in (0, 1)
        ]
        return CellRun(key=key, status="error", ranks=ranks, duration_s=0.1)


def test_a_megabyte_error_message_is_clipped_in_the_record_keeping_head_and_tail(tmp_path):
    session, _ = _session(tmp_path, resume=False, launcher=_HugeErrorLauncher())
    rec = session.run(_healthy_cells()[0])
    assert rec.verdict == "REGRESSION"  # a healthy cell that raised: judged on what was raised
    line = (tmp_path / records.RECORDS_FILE).read_bytes()
    assert len(line) < 256 << 10, f"record line of {len(line)} bytes"
    (kept,) = records.iter_records(tmp_path)
    texts = [kept.observed.error_message] + [t for r in kept.observed.ranks for t in (r.error_message, r.traceback)]
    for text in texts:
        assert "HEAD of the message" in text and text.endswith(" the TAIL")
    assert kept.observed.ranks[0].traceback.startswith("Traceback (most recent call last):")


# ---- a results file that cannot be written, a results dir deleted mid-run ------------------------------


def _one_error_line(out: str, path: Path) -> str:
    """The run stopped with one line naming ``path``, and no traceback."""
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if str(path) in line]
    assert len(lines) == 1, out
    return lines[0]


def _run_cells(results: Path, cells, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fsdp_matrix", "run", "--matrix", str(HERE / "fault_matrix.yaml")]
    cmd += ["--results", str(results), "--combo", "local", *extra, *cells]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_a_results_file_that_cannot_be_appended_to_stops_run_before_any_launch(tmp_path):
    (tmp_path / records.RECORDS_FILE).mkdir()  # root may write anywhere: a directory in its place cannot be appended
    proc = _run_cells(tmp_path, CELLS[:2])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = _one_error_line(proc.stdout + proc.stderr, tmp_path / records.RECORDS_FILE)
    assert "cannot append" in line, line
    assert not (tmp_path / "launches").exists()  # no cell was run to lose its verdict


def test_an_immutable_results_file_stops_run_before_any_launch(tmp_path):
    """The review's repro: ``chattr +i`` on cells.jsonl (root can write a read-only file, not an immutable one)."""
    file = tmp_path / records.RECORDS_FILE
    file.write_text("")
    if subprocess.run(["chattr", "+i", str(file)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs ext4-like filesystem and CAP_LINUX_IMMUTABLE)")
    try:
        proc = _run_cells(tmp_path, CELLS[:2], "--resume")
    finally:
        subprocess.run(["chattr", "-i", str(file)], check=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot append" in _one_error_line(proc.stdout + proc.stderr, file)
    assert not (tmp_path / "launches").exists()


def test_a_full_disk_is_refused_before_the_first_launch(tmp_path, monkeypatch):
    from fsdp_matrix.errors import MatrixError

    real = os.statvfs

    def full(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, *tuple(st)[5:]))

    monkeypatch.setattr(os, "statvfs", full)
    with pytest.raises(MatrixError, match=str(tmp_path / records.RECORDS_FILE)):
        _session(tmp_path, resume=False)


def test_a_record_that_cannot_be_written_mid_run_stops_the_session_with_one_line(tmp_path, monkeypatch):
    from fsdp_matrix.errors import MatrixError

    session, launcher = _session(tmp_path, resume=False)
    cells = _healthy_cells()
    session.run(cells[0])
    real = records.append

    def disk_full(results, rec):
        raise OSError(28, "No space left on device", str(results / records.RECORDS_FILE))

    monkeypatch.setattr(records, "append", disk_full)
    with pytest.raises(MatrixError, match="No space left on device") as stopped:
        session.run(cells[1])
    assert str(tmp_path / records.RECORDS_FILE) in str(stopped.value) and "\n" not in str(stopped.value)
    monkeypatch.setattr(records, "append", real)


@pytest.mark.heavy  # nox -s heavy: a long end-to-end run
def test_results_dir_deleted_mid_run_stops_at_once_and_accuses_no_cell(tmp_path):
    """The review's repro: the results dir removed while a cell runs gave a false ``hang`` after the whole cell
    timeout, and the run went on in a new launch. It must stop, saying the launch directory went."""
    results = tmp_path / "res"
    cmd = [sys.executable, "-m", "fsdp_matrix", "run", "--matrix", str(HERE / "fault_matrix.yaml")]
    cmd += ["--results", str(results), "--combo", "local", "--cell-timeout", "20"]
    cmd += ["faults/fault_hang_rank1-ws2", "faults/fault_ok-ws2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        started = wait_for_rank1_start(results, proc)
        ids = _launch_ids(results)
        shutil.rmtree(results)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, out
    line = _one_error_line(out, started[0].parent)
    assert "removed" in line and "observed hang" not in out, out
    assert not results.exists()  # nothing recreated it to file a verdict into
    assert _none_alive(ids, 60)


# ---- --resume re-judges a changed requirement or an older harness (review 2026-11-28 defect 5) ---------------------


def _matrix_requiring(tmp: Path, requires: str) -> Path:
    """fault_matrix.yaml with ``requires`` on the ``healthy`` case (its repro paths still relative to HERE)."""
    text = (HERE / "fault_matrix.yaml").read_text()
    anchor = "    repro: fault_cells.py\n    grids:\n      - {fault: [ok], n: [1, 2, 3, 4, 5, 6], sleep: [1]}\n"
    assert anchor in text
    path = tmp / "requiring.yaml"
    (tmp / "fault_cells.py").symlink_to(HERE / "fault_cells.py")  # a matrix's repro paths are relative to it
    path.write_text(text.replace(anchor, anchor + f"    requires:\n      - {requires}\n"))
    return path


def _session_of(matrix: Path, results: Path, resume: bool):
    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.runner.session import Session

    launcher = _CountingLauncher()
    versions = {"torch": "2.13.0", "peft": "0.21.2"}
    return Session(load_matrix(matrix), launcher, results, versions, combo="local", resume=resume, repo_root=HERE), (
        launcher
    )


def test_resume_reruns_a_skip_whose_requirement_was_lifted(tmp_path):
    """A cell skipped for ``needs cuda`` kept that skip under --resume after the case's ``requires`` was removed,
    quoting a requirement that no longer exists; a fresh run gave REGRESSION."""
    cell = _healthy_cells()[0]
    needing = _matrix_requiring(tmp_path, "{device: cuda, reason: needs a GPU}")
    session, launcher = _session_of(needing, tmp_path / "res", resume=False)
    assert session.run(cell).verdict == "skipped" and launcher.ran == []
    session, launcher = _session_of(HERE / "fault_matrix.yaml", tmp_path / "res", resume=True)
    session.prefetch([cell])
    assert session.run(cell).verdict == "fix-holds"
    assert launcher.ran == [cell.key]


def test_resume_does_not_keep_a_run_whose_case_now_requires_what_this_run_lacks(tmp_path):
    cell = _healthy_cells()[0]
    session, launcher = _session_of(HERE / "fault_matrix.yaml", tmp_path / "res", resume=False)
    assert session.run(cell).verdict == "fix-holds" and launcher.ran == [cell.key]
    needing = _matrix_requiring(tmp_path, "{device: cuda, reason: needs a GPU}")
    session, launcher = _session_of(needing, tmp_path / "res", resume=True)
    rec = session.run(cell)
    assert rec.verdict == "skipped" and "needs cuda" in rec.observed.error_message and launcher.ran == []


def test_resume_reruns_records_of_an_older_harness(tmp_path):
    """Records that a harness before the collectives check wrote (schema 1) were kept: their verdicts never went
    through the checks this harness has."""
    cell = _healthy_cells()[0]
    session, launcher = _session_of(HERE / "fault_matrix.yaml", tmp_path / "res", resume=False)
    session.run(cell)
    file = tmp_path / "res" / records.RECORDS_FILE
    older = file.read_text().replace(f'"schema": {records.SCHEMA}', '"schema": 1')
    assert older != file.read_text()
    file.write_text(older)
    session, launcher = _session_of(HERE / "fault_matrix.yaml", tmp_path / "res", resume=True)
    session.prefetch([cell])
    session.run(cell)
    assert launcher.ran == [cell.key]


def test_a_record_says_which_harness_judged_it_and_under_which_requirement(tmp_path):
    from fsdp_matrix.runner.session import harness_version

    cell = _healthy_cells()[0]
    needing = _matrix_requiring(tmp_path, "{min_world_size: 2, reason: two ranks at least}")
    session, _ = _session_of(needing, tmp_path / "res", resume=False)
    rec = session.run(cell)
    assert rec.harness == harness_version() and rec.harness.startswith(f"{records.SCHEMA}-")
    # stored in the one rule grammar, where the reason is spelled skip (reason: is read as its alias)
    assert rec.requires == [{"min_world_size": 2, "skip": "two ranks at least"}]
    [back] = records.iter_records(tmp_path / "res" / records.RECORDS_FILE)
    assert (back.harness, back.requires, back.schema) == (rec.harness, rec.requires, records.SCHEMA)
    # the same requirement, still met: --resume keeps the record
    session, launcher = _session_of(needing, tmp_path / "res", resume=True)
    assert session.run(cell).run_id == rec.run_id and launcher.ran == []
