from types import SimpleNamespace

import pytest

from fsdp_matrix.cells import Cell
from fsdp_matrix.pytest_plugin import check_record, pytest_collection_modifyitems
from fsdp_matrix.records import Observed, RankResult, Record
from fsdp_matrix.report.failure import failure_text
from tests.helpers import BAD_INPUTS, matrix_data, wait_for_rank1_start, write_matrix


def _record(verdict, status="error", ranks=()):
    return Record(
        case="dora-sharded-weight",
        cell="dora-fp32-orig1-peft_policy-llama-ws2",
        params={},
        versions={},
        device="cpu",
        world_size=2,
        expected={"kind": "ok"},
        observed=Observed(
            status=status, error_type="IndexError", error_message="tuple index out of range", ranks=list(ranks)
        ),
        verdict=verdict,
        duration_s=0.1,
        line="expected ok / observed IndexError: tuple index out of range",
    )


def test_failure_text_has_the_line_and_every_rank():
    ranks = [
        RankResult(rank=0, status="error", traceback="Traceback...\nIndexError: tuple index out of range"),
        RankResult(
            rank=1, status="crash", exit_code=-11, signal="SIGSEGV", stack="Fatal Python error: Segmentation fault"
        ),
    ]
    text = failure_text(_record("REGRESSION", ranks=ranks))
    first, *rest = text.splitlines()
    assert first == (
        "REGRESSION: dora-sharded-weight/dora-fp32-orig1-peft_policy-llama-ws2: "
        "expected ok / observed IndexError: tuple index out of range"
    )
    assert "--- rank 0: error" in rest and "--- rank 1: crash, exit code -11 (SIGSEGV)" in rest
    assert "Fatal Python error: Segmentation fault" in text


@pytest.mark.parametrize("verdict", ["REGRESSION", "UNEXPECTED-FIX", "DIFFERENT-ERROR", "hang", "crash", "env-error"])
def test_only_matching_outcomes_pass(verdict):
    with pytest.raises(pytest.fail.Exception):
        check_record(_record(verdict))


def test_matches_pass_and_skips_skip():
    check_record(_record("reproduced"))
    check_record(_record("fix-holds", status="ok"))
    with pytest.raises(pytest.skip.Exception, match="needs cuda"):
        check_record(
            Record(
                **{**_record("skipped").__dict__, "observed": Observed(status="skipped", error_message="needs cuda")}
            )
        )


def _pytest(*args: str):
    import subprocess
    import sys
    from pathlib import Path

    repos = Path(__file__).resolve().parent / "test_repros.py"
    # --device cpu: `auto` would import torch (about 3 s) only to look for a GPU
    cmd = [sys.executable, "-m", "pytest", str(repos), "--collect-only", "-q", "-p", "no:cacheprovider"]
    cmd += ["--device", "cpu", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _usage_error(proc) -> str:
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ERROR:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.parametrize("defect", sorted(BAD_INPUTS))
def test_plugin_rejects_bad_matrix_with_one_usage_line(tmp_path, defect):
    """As a pytest run sees them."""
    data, names = BAD_INPUTS[defect]
    line = _usage_error(_pytest("--matrix", str(write_matrix(tmp_path, data))))
    assert names in line and "\x00" not in line, line


def test_plugin_cases_filter_that_matches_nothing_is_a_usage_error(tmp_path):
    """--cases naming no case is a usage error, not zero cells and silence."""
    matrix = write_matrix(tmp_path, matrix_data())
    line = _usage_error(_pytest("--matrix", str(matrix), "--cases", "lora-requires-gard"))
    assert "--cases" in line and "'lora-requires-gard'" in line, line


def test_a_combo_that_pairs_versions_for_some_cases_runs_only_those(tmp_path):
    """A combo with ``cases:`` (e.g. torch2.6-acc1.12, built for accelerate#3923) collects only their cells there,
    also under a wider ``--cases``; other combos collect every cell."""
    data = matrix_data()
    other = {**data["cases"][0], "id": "other-case"}
    data["cases"].append(other)
    data["combos"].append({**data["combos"][0], "id": "pairing", "cases": ["other-case"]})
    matrix = write_matrix(tmp_path, data)
    paired = _pytest("--matrix", str(matrix), "--combo", "pairing").stdout
    assert "other-case/" in paired and "lora-requires-grad/" not in paired, paired
    wider = _pytest("--matrix", str(matrix), "--combo", "pairing", "--cases", "lora-requires-grad").stdout
    assert "lora-requires-grad/" not in wider and "other-case/" not in wider, wider  # nothing of either here
    everything = _pytest("--matrix", str(matrix), "--combo", "current").stdout
    assert "other-case/" in everything and "lora-requires-grad/" in everything, everything


# ---- through the plugin (nox -s matrix): stop at once, one line naming the path -------------------------


def _cells_run(results, *args):
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    cmd = [sys.executable, "-m", "pytest", str(here / "test_repros.py"), "-q", "-p", "no:cacheprovider"]
    cmd += ["--matrix", str(here / "runner" / "fault_matrix.yaml"), "--results", str(results), "--combo", "local"]
    return subprocess.Popen(
        cmd + ["--device", "cpu", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _naming(out, path):
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if str(path) in line]
    assert len(lines) == 1, out
    return lines[0]


def test_plugin_stops_before_any_launch_when_the_results_file_cannot_be_appended_to(tmp_path):
    (tmp_path / "cells.jsonl").mkdir()  # root may write anywhere: a directory in its place cannot be appended
    proc = _cells_run(tmp_path, "--cases", "healthy", "-k", "n1 or n2")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode not in (0, 1), out  # not a run of failed cells: the run did not happen
    assert "cannot append" in _naming(out, tmp_path / "cells.jsonl")
    assert not (tmp_path / "launches").exists() and "passed" not in out and "failed" not in out, out


@pytest.mark.heavy  # a launch of its own; the appending refusal below stays in nox -s tests
def test_plugin_stops_at_once_when_the_results_dir_is_deleted_mid_run(tmp_path):
    import os
    import shutil
    import signal

    results = tmp_path / "res"
    proc = _cells_run(results, "--cases", "faults", "-k", "hang_rank1 or fault_ok", "--cell-timeout", "20")
    try:
        started = wait_for_rank1_start(results, proc)
        shutil.rmtree(results)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode not in (0, 1), out
    assert "removed" in _naming(out, started[0].parent)
    assert "observed hang" not in out and not results.exists(), out


def test_cells_sort_by_layout_with_compile_cells_last_within_each():
    def item(name, world_size, compile_=None, layout=True):
        params = (("adapter", "lora"),) + ((("compile", compile_),) if compile_ else ())
        cell = Cell(case="c", params=params, world_size=world_size)
        marker = object() if layout else None
        return SimpleNamespace(
            name=name, callspec=SimpleNamespace(params={"cell": cell}), get_closest_marker=lambda _: marker
        )

    plain = SimpleNamespace(name="unit", get_closest_marker=lambda _: None)
    items = [
        item("a2-whole", 2, "whole"),
        plain,
        item("a4", 4),
        item("a2", 2, "none"),
        item("b4-regional", 4, "regional"),
        item("b2", 2),
        item("nolayout-whole", 2, "whole", layout=False),
    ]
    pytest_collection_modifyitems(items)
    assert [i.name for i in items] == ["unit", "nolayout-whole", "a2", "b2", "a2-whole", "a4", "b4-regional"]
