"""``pytest --pyargs fsdp_matrix.suite`` in an env where the harness is installed from its wheel, not run from a
checkout: the wheel ships matrix.yaml and repros/, the suite finds them through importlib.resources, its markers
select the CPU gate, and every cell's report-log line and JUnit testcase carry its verdict, signatures and versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from fsdp_matrix.cells import Cell
from fsdp_matrix.expectations import Expected
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.pytest_plugin import gate_marks, record_properties, say_uncovered
from fsdp_matrix.records import Observed, Record
from fsdp_matrix.suite.entry import names_the_suite

ROOT = Path(__file__).resolve().parent.parent
ONE_CELL = "no-split-modules/lora-orig0-cls_env_unset-shape_plain-ws2"
"""A real cell of the old and current combos that reproduces in seconds (one 2-rank launch)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harness's wheel as `pip install <checkout>` builds it, unpacked as an installer lays it out."""
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("wheel")
    built = Path(next(WheelBuilder(str(ROOT)).build(directory=str(out / "dist"), versions=["standard"])))
    with zipfile.ZipFile(built) as zf:
        zf.extractall(out / "site")
    return out / "site"


def _installed_python(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c code`` with the unpacked wheel first on the path (ahead of this checkout's editable install)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_the_wheel_ships_every_repro_matrix_yaml_names_and_the_suite(wheel: Path) -> None:
    shipped = wheel / "fsdp_matrix" / "_data"
    assert (shipped / "matrix.yaml").read_text() == (ROOT / "matrix.yaml").read_text()
    for case in load_matrix(ROOT / "matrix.yaml").cases:
        assert (shipped / case.repro).read_bytes() == (ROOT / case.repro).read_bytes(), case.repro
    assert sorted(p.name for p in (shipped / "repros" / "upstream").glob("*.py")) == sorted(
        p.name for p in (ROOT / "repros" / "upstream").glob("*.py")
    )
    for name in ("conftest.py", "test_cells.py", "entry.py"):
        assert (wheel / "fsdp_matrix" / "suite" / name).is_file()
    entry = next(wheel.glob("fsdp_matrix-*.dist-info")) / "entry_points.txt"
    assert "fsdp_matrix_suite = fsdp_matrix.suite.entry" in entry.read_text()


def test_an_installed_harness_reads_its_own_copy_of_the_cases(wheel: Path, tmp_path: Path) -> None:
    code = (
        "from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix; load_matrix(DEFAULT_MATRIX); print(DEFAULT_MATRIX)"
    )
    proc = _installed_python(wheel, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == wheel / "fsdp_matrix" / "_data" / "matrix.yaml"


def test_a_checkout_reads_its_own_matrix_yaml() -> None:
    from fsdp_matrix.matrix import DEFAULT_MATRIX

    assert DEFAULT_MATRIX == ROOT / "matrix.yaml"


def test_pyargs_suite_runs_a_gate_cell_with_report_log_and_junit(wheel: Path, tmp_path: Path) -> None:
    """The whole path upstream takes: the suite by module name, the gate marker, both report formats."""
    argv = ["-m", "pytest", "--pyargs", "fsdp_matrix.suite", "-m", "cpu_gate", "-k", ONE_CELL.split("/")[1]]
    argv += ["--cases", "no-split-modules", "--device", "cpu", "-p", "no:cacheprovider", "-p", "no:xdist"]
    argv += ["--report-log", "out.jsonl", "--junitxml", "out.xml", "--results", "results"]
    env = {**os.environ, "PYTHONPATH": str(wheel)}
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all("$report_type" in line for line in lines)
    assert lines[0]["$report_type"] == "SessionStart" and lines[-1]["$report_type"] == "SessionFinish"
    call = next(line for line in lines if line.get("when") == "call")
    props = dict(call["user_properties"])
    assert ONE_CELL in call["nodeid"] and props["verdict"] == "reproduced" and props["combo"] == "installed"
    assert (tmp_path / call["location"][0]).resolve() == wheel / "fsdp_matrix" / "suite" / "test_cells.py"
    assert json.loads(props["versions"])["peft"] and json.loads(props["expected_signature"])["kind"] == "error"
    assert json.loads(props["observed_signature"])["status"] == "error"
    case = ET.parse(tmp_path / "out.xml").getroot().find(".//testcase")
    junit = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert junit == props
    rec = json.loads((tmp_path / "results" / "cells.jsonl").read_text())
    assert rec["combo"] == "installed" and rec["verdict"] == props["verdict"]


# ---- without a launch ----------------------------------------------------------------------------------------


def _record(**kw) -> Record:
    base = dict(case="c", cell="a-ws2", params={}, versions={"peft": "0.13.2", "torch": "2.13.0"}, device="cpu")
    base.update(world_size=2, expected={"kind": "ok", "source": "peft#1"}, verdict="REGRESSION", duration_s=1.0)
    base.update(observed=Observed(status="error", error_type="ValueError", error_message="boom\nmore", location="m.f"))
    return Record(**{**base, **kw}, line="expected ok / observed ValueError: boom in m.f", combo="installed")


def test_record_properties_name_verdict_signatures_and_versions() -> None:
    src = {"peft": {"url": "file:///peft", "ref": None, "commit": "e" * 40, "dirty": None, "release": "0.13.2"}}
    props = dict(record_properties(_record(sources=src)))
    assert props["cell"] == "c/a-ws2" and props["verdict"] == "REGRESSION" and props["expected"] == "ok"
    assert props["rule_source"] == "peft#1"
    assert json.loads(props["expected_signature"]) == {"kind": "ok"}
    assert json.loads(props["observed_signature"]) == {
        "status": "error",
        "error_type": "ValueError",
        "message": "boom",
        "location": "m.f",
    }
    assert json.loads(props["versions"]) == {"peft": "0.13.2", "torch": "2.13.0"}
    assert json.loads(props["sources"])["peft"]["commit"] == "e" * 40
    assert all(isinstance(v, str) for v in props.values())  # JUnit writes str(value): JSON text reads the same


def test_gate_marks_take_two_rank_cpu_cells_without_compile() -> None:
    def names(cell: Cell) -> list:
        return [m.name for m in gate_marks(cell)]

    assert names(Cell("c", (("compile", "none"),))) == ["cpu_gate"]
    assert names(Cell("c", (("compile", "full"),))) == []
    assert names(Cell("c", (), world_size=4)) == [] and names(Cell("c", (), world_size=4, nodes=2)) == []
    assert names(Cell("c", (), device="cuda")) == ["gpu_nightly"]
    assert names(Cell("c", (), device="cuda", world_size=4)) == ["gpu_nightly"]


def test_the_entry_point_wakes_only_for_the_suite() -> None:
    suite = ROOT / "fsdp_matrix" / "suite"
    assert names_the_suite(["--pyargs", "fsdp_matrix.suite"]) and names_the_suite(["fsdp_matrix.suite.test_cells"])
    assert names_the_suite([str(suite)]) and names_the_suite([f"{suite / 'test_cells.py'}::test_cell"])
    assert not names_the_suite(["tests/test_cells.py", "-k", "lora"])
    assert not names_the_suite(["fsdp_matrix.suitecase", str(ROOT / "tests"), "-m", "cpu_gate"])


def test_a_cell_no_rule_covers_is_named_on_the_terminal_before_it_runs() -> None:
    lines: list = []

    class Terminal:
        def write_line(self, line: str) -> None:
            lines.append(line)

    class Plugins:
        def get_plugin(self, name: str) -> object:
            return Terminal() if name == "terminalreporter" else None

    class Config:
        pluginmanager = Plugins()

    class Session:
        def expected(self, cell: Cell) -> Expected:
            return Expected("none") if cell.case == "new" else Expected("ok")

    say_uncovered(Config(), Session(), [Cell("old", ()), Cell("new", ())])
    assert lines == [
        "not covered: new/ws2: no rule of matrix.yaml matches it at the installed versions; it runs and fails"
    ]
