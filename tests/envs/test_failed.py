"""A combo whose env cannot be built: env-error records for exactly the cells asked for, one line, no traceback.

These run the real ``nox`` sessions against a package index that refuses connections, in a temporary env dir.
Nothing is installed: the install fails at its first request. So nox must not install the noxfile's own script
dependencies either (that would fail first): the nox of this checkout's script-mode env, else the ``nox`` on PATH
(which is what ran ``nox -s tests``), runs with ``NOX_SCRIPT_MODE=none``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from fsdp_matrix.cells import expand
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.records import iter_records

ROOT = Path(__file__).resolve().parents[2]
DEAD_INDEX = "http://127.0.0.1:9/simple"
_CANDIDATES = (ROOT / ".nox" / "_nox_script_mode" / "bin" / "nox", shutil.which("nox"))
NOX = next((str(p) for p in _CANDIDATES if p and Path(p).exists()), None)
needs_nox = pytest.mark.skipif(NOX is None, reason="the nox command is not on PATH")


def run_nox(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_INDEX", "UV_EXTRA_INDEX", "UV_FIND_LINKS"))}
    env.update({"UV_DEFAULT_INDEX": DEAD_INDEX, "UV_HTTP_RETRIES": "0", "UV_NO_CACHE": "1", "NOX_SCRIPT_MODE": "none"})
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        [NOX, "-f", str(ROOT / "noxfile.py"), "--envdir", str(tmp_path / "nox"), "-x", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )


def recorded(results: Path) -> List[str]:
    return sorted(r.key for r in iter_records(results)) if results.exists() else []


@needs_nox
@pytest.mark.timeout(600)
def test_newest_with_an_unreachable_index_writes_env_error_records(tmp_path: Path) -> None:
    # The resolution's EnvError ended `nox -s newest` in a traceback with no records
    res = tmp_path / "res"
    proc = run_nox(tmp_path, "-s", "newest", "--", "--results", str(res), "--device=cpu", "--cases=disable-adapter")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if "env-error for newest" in line]
    assert len(errors) == 1 and "127.0.0.1:9" in errors[0], out[-3000:]
    records = list(iter_records(res / "newest"))
    cells = expand(load_matrix(ROOT / "matrix.yaml"), "cpu", 2, ["disable-adapter"])
    assert sorted(r.key for r in records) == sorted(c.key for c in cells)
    assert {r.verdict for r in records} == {"env-error"} and {r.combo for r in records} == {"newest"}
    # the last known pins: matrix.yaml's documented resolution, as no earlier record exists
    pins = load_matrix(ROOT / "matrix.yaml").combo("newest").pins.model_dump()
    assert all(r.versions.get("peft") == pins["peft"] for r in records)


@needs_nox
@pytest.mark.timeout(600)
def test_failed_env_records_only_the_cells_selected_by_cases(tmp_path: Path) -> None:
    # --cases no-split-modules asked for 8 cells, and all 202 got env-error records
    res = tmp_path / "res"
    select = "--cases=no-split-modules"
    proc = run_nox(tmp_path, "-s", "matrix(old)", "--", "--results", str(res), "--device=cpu", select)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "env-error for old" in out, out[-3000:]
    cells = expand(load_matrix(ROOT / "matrix.yaml"), "cpu", 2, ["no-split-modules"])
    assert recorded(res / "old") == sorted(c.key for c in cells)


def pytest_selection(*args: str) -> List[str]:
    """The cell keys pytest itself selects from tests/test_repros.py with these options."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_repros.py"), "--collect-only", "-q",
         "-p", "no:cacheprovider", "--combo", "old", "--device", "cpu", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    keys = [line.split("[", 1)[1][:-1] for line in proc.stdout.splitlines() if "::test_cell[" in line]
    assert keys, proc.stdout[-2000:] + proc.stderr[-2000:]
    return sorted(keys)


@needs_nox
@pytest.mark.timeout(600)
def test_failed_env_records_only_the_cells_pytest_would_select_with_k(tmp_path: Path) -> None:
    # The same with -k, judged against pytest's own selection of the same options
    res = tmp_path / "res"
    sel = ["--cases", "dora-sharded-weight,no-split-modules", "-k", "fsdp2 or (gemma and not orig1)"]
    proc = run_nox(tmp_path, "-s", "matrix(old)", "--", "--results", str(res), "--device", "cpu", *sel)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "env-error for old" in out, out[-3000:]
    if "pytest cannot be imported here" in out:
        pytest.skip(f"the nox that ran ({NOX}) has no pytest, so -k is not applied (the log says so)")
    want = pytest_selection(*sel)
    assert 0 < len(want) < len(expand(load_matrix(ROOT / "matrix.yaml"), "cpu", 2, sel[1].split(",")))
    assert recorded(res / "old") == want


def test_selection_reads_cases_and_k_as_pytest_gets_them() -> None:
    from fsdp_matrix.envs.failed import selection

    assert selection(["-n", "2", "--cases=a, b", "-kdora and not x"]) == (["a", "b"], "dora and not x")
    assert selection(["--cases", "a", "-k", "first", "-k", "last"]) == (["a"], "last")
    assert selection(["--resume"]) == (None, None)


def test_last_known_pins_are_what_the_combo_last_ran(tmp_path: Path) -> None:
    from fsdp_matrix.envs.failed import last_known_pins, write_env_errors

    matrix = load_matrix(ROOT / "matrix.yaml")
    pins = {"torch": "2.15.0", "peft": "0.21.2"}
    assert last_known_pins(tmp_path, pins) == pins
    cells = expand(matrix, "cpu", 2, ["disable-adapter"])[:1]
    write_env_errors(matrix, "newest", tmp_path, cells, "ran", {"torch": "2.15.1", "peft": "0.22.0"})
    assert last_known_pins(tmp_path, pins) == {"torch": "2.15.1", "peft": "0.22.0"}


@needs_nox
@pytest.mark.timeout(600)
def test_failed_env_with_an_unknown_case_is_one_line(tmp_path: Path) -> None:
    proc = run_nox(tmp_path, "-s", "matrix(old)", "--", "--results", str(tmp_path / "res"), "--cases=nope")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert "--cases: no case 'nope'" in out and not (tmp_path / "res").exists(), out[-3000:]


@needs_nox
@pytest.mark.timeout(600)
@pytest.mark.parametrize("pin", ["peft={tmp}/missing", "peft=", "torch={root}", "peft={root}@no-such-ref-xyz"])
def test_a_pin_that_cannot_be_resolved_is_a_usage_error_that_writes_no_record(tmp_path: Path, pin: str) -> None:
    """Every unresolvable ``--pin`` appended env-error records under the release combo, with the release's versions
    and no sources: they superseded its good records in the report and diff."""
    res = tmp_path / "res"
    pin = pin.format(tmp=tmp_path, root=ROOT)
    where = ["--results", str(res), "--device=cpu", "--cases=disable-adapter"]
    proc = run_nox(tmp_path, "-s", "matrix(current)", "--", "--pin", pin, *where)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and recorded(res / "current") == [], out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("nox -s matrix(current) -- --pin")]
    assert len(errors) == 1, out[-3000:]


@needs_nox
@pytest.mark.timeout(600)
def test_an_env_that_fails_to_build_from_a_resolved_source_names_the_source_in_its_records(tmp_path: Path) -> None:
    """The env-error records of a source pin carried no ``sources``: they read as the release combo's."""
    from tests.sources_support import make_toy_repo

    shas = make_toy_repo(tmp_path / "toypkg")
    res = tmp_path / "res"
    where = ["--results", str(res), "--device=cpu", "--cases=disable-adapter"]
    proc = run_nox(tmp_path, "-s", "matrix(current)", "--", "--pin", f"peft={tmp_path / 'toypkg'}@v0.1.0", *where)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "env-error for current" in out, out[-3000:]
    records = list(iter_records(res / "current"))
    assert records and {r.verdict for r in records} == {"env-error"}, out[-3000:]
    assert all((r.sources or {}).get("peft", {}).get("commit") == shas["c0"] for r in records), records[0].sources
