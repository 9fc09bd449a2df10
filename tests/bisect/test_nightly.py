"""The nightly's wiring (diff -> upgrade -> step summary), driven with two fake nights and a fake upgrade check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from fsdp_matrix.bisect import nightly
from fsdp_matrix.report.json import REPORT_SCHEMA

CELL_FIX = "no-split-modules/lora-orig0-cls_env_unset-shape_plain-ws2"
CELL_SAME = "lora-requires-grad/lora-fp32-orig1-decoder_layer-llama-ws2"
NIGHT1 = {
    "torch": "2.15.0",
    "peft": "0.21.2",
    "transformers": "5.23.0",
    "accelerate": "1.15.0",
    "bitsandbytes": "0.50.2",
}


def night(path: Path, versions: Dict[str, str], verdicts: Dict[str, str], column: str = "newest") -> Path:
    """A report.json as ``python -m fsdp_matrix report`` writes it, with only what the nightly reads."""
    entries = {
        cell: {"verdict": v, "line": f"expected ... / observed {v}", "versions": versions}
        for cell, v in verdicts.items()
    }
    data = {
        "schema": REPORT_SCHEMA,
        "columns": [{"id": column, "number": 1, "label": column, "versions": versions, "mixed": False}],
        "rows": [{"case": c.split("/")[0], "cell": c.split("/")[1]} for c in verdicts],
        "entries": {column: entries},
        "counts": {},
    }
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def upgrades(monkeypatch: pytest.MonkeyPatch) -> List[Dict[str, Any]]:
    calls: List[Dict[str, Any]] = []

    def fake(base, bumps, cases, args):
        calls.append({"base": base.pins.model_dump(), "combo": base.id, "bumps": dict(bumps), "cases": list(cases)})
        return {
            "changed": [
                {
                    "cell": CELL_FIX,
                    "base_verdict": "fix-holds",
                    "target_verdict": "REGRESSION",
                    "first_changed": {"peft": "0.22.1"},
                    "last_unchanged": {"peft": "0.22.0"},
                }
            ],
            "installs": 4,
            "installed": 4,
            "install_bound": 5,
        }

    monkeypatch.setattr(nightly, "check_upgrade", fake)
    return calls


def run(tmp_path: Path, old: Path, new: Path) -> tuple:
    summary = tmp_path / "summary.md"
    code = nightly.main([str(old), str(new), "--summary", str(summary), "--json", str(tmp_path / "n.json")])
    return code, summary.read_text() if summary.exists() else ""


def test_versions_moved_and_a_verdict_changed_runs_the_upgrade_and_names_the_release(tmp_path, upgrades) -> None:
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds", CELL_SAME: "fix-holds"})
    new = night(
        tmp_path / "new.json",
        {**NIGHT1, "peft": "0.22.1", "torch": "2.15.0+cpu"},
        {CELL_FIX: "REGRESSION", CELL_SAME: "fix-holds"},
    )
    code, summary = run(tmp_path, old, new)
    assert code == 1, "a new REGRESSION fails the night"
    # the upgrade check ran from last night's versions to tonight's, on the changed cell's case only
    assert upgrades == [{"base": NIGHT1, "combo": "newest", "bumps": {"peft": "0.22.1"}, "cases": ["no-split-modules"]}]
    assert "## Changes since the previous night" in summary and "NEW REGRESSIONS (1)" in summary
    assert "### Upgrade check for `newest`: peft 0.21.2 -> 0.22.1" in summary
    assert f"| `{CELL_FIX}` | fix-holds | REGRESSION | **peft 0.22.1** | peft 0.22.0 |" in summary
    saved = json.loads((tmp_path / "n.json").read_text())
    assert saved["upgrades"][0]["result"]["changed"][0]["first_changed"] == {"peft": "0.22.1"}


def test_same_versions_no_upgrade_check(tmp_path, upgrades) -> None:
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds"})
    new = night(tmp_path / "new.json", NIGHT1, {CELL_FIX: "REGRESSION"})
    code, summary = run(tmp_path, old, new)
    assert code == 1 and upgrades == [] and "Upgrade check" not in summary


def test_versions_moved_but_no_verdict_changed_no_upgrade_check(tmp_path, upgrades) -> None:
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds"})
    new = night(tmp_path / "new.json", {**NIGHT1, "transformers": "5.24.0"}, {CELL_FIX: "fix-holds"})
    code, summary = run(tmp_path, old, new)
    assert code == 0 and upgrades == []
    assert "newest: transformers 5.23.0 -> 5.24.0" in summary and "No verdict changed." in summary


def test_unreadable_report_is_exit_2(tmp_path, upgrades) -> None:
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds"})
    (tmp_path / "bad.json").write_text("{}")
    assert run(tmp_path, old, tmp_path / "bad.json")[0] == 2


def test_defect9_a_fix_that_now_crashes_fails_the_night(tmp_path, upgrades) -> None:
    """Issue 17 defect 9: fix-holds -> crash, with the versions unchanged, exited 0."""
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds", CELL_SAME: "reproduced"})
    new = night(tmp_path / "new.json", NIGHT1, {CELL_FIX: "crash", CELL_SAME: "hang"})
    code, summary = run(tmp_path, old, new)
    assert code == 1 and "Passing cells that now need attention (2)" in summary


@pytest.mark.parametrize("tonight", ["env-error", "crash", "hang", "skipped"])
def test_defect10_verdicts_not_about_the_bug_run_no_upgrade_check(tmp_path, upgrades, tonight) -> None:
    """Issue 17 defect 10: an env-error night (e.g. a floating combo that cannot be installed) ran the upgrade check,
    which reinstalled last night's env, ran every cell and failed for the same reason. Only changes about the bug
    (reproduced, fix-holds, REGRESSION, UNEXPECTED-FIX, DIFFERENT-ERROR on both nights) are worth bisecting."""
    moved = {**NIGHT1, "peft": "0.99.0"}
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds", CELL_SAME: "reproduced"})
    new = night(tmp_path / "new.json", moved, {CELL_FIX: tonight, CELL_SAME: tonight})
    run(tmp_path, old, new)
    assert upgrades == []
    # and back: last night's env-error is no evidence either
    back = night(tmp_path / "back.json", NIGHT1, {CELL_FIX: "REGRESSION", CELL_SAME: "fix-holds"})
    run(tmp_path, new, back)
    assert upgrades == []


def test_defect10_a_different_error_still_runs_the_upgrade_check(tmp_path, upgrades) -> None:
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "reproduced"})
    new = night(tmp_path / "new.json", {**NIGHT1, "peft": "0.22.1"}, {CELL_FIX: "DIFFERENT-ERROR"})
    run(tmp_path, old, new)
    assert [u["cases"] for u in upgrades] == [["no-split-modules"]]
