"""The nightly's wiring (diff -> upgrade -> step summary), driven with two fake nights and a fake upgrade check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from fsdp_matrix.bisect import nightly
from fsdp_matrix.bisect.search import install_bound
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


@pytest.fixture(autouse=True)
def reruns_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flip repeats in its reruns tonight, and last night's commits give last night's verdict: confirmed (the
    reruns themselves are tests/test_confirm.py's)."""
    from fsdp_matrix.confirm import TONIGHT, confirm

    def fake(flips, envs, args):
        def rerun(ask):
            return {f.cell: (f.new if ask.at == TONIGHT else f.old) for f in flips if f.column == ask.column}

        return confirm(flips, rerun, [f.column for f in flips if nightly.moved(envs, f.column)], args.reruns)

    monkeypatch.setattr(nightly, "confirm_flips", fake)


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
    """Fix-holds -> crash, with the versions unchanged, exited 0."""
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds", CELL_SAME: "reproduced"})
    new = night(tmp_path / "new.json", NIGHT1, {CELL_FIX: "crash", CELL_SAME: "hang"})
    code, summary = run(tmp_path, old, new)
    assert code == 1 and "Passing cells that now need attention (2)" in summary


@pytest.mark.parametrize("tonight", ["env-error", "crash", "hang", "skipped"])
def test_defect10_verdicts_not_about_the_bug_run_no_upgrade_check(tmp_path, upgrades, tonight) -> None:
    """An env-error night (e.g. a floating combo that cannot be installed) ran the upgrade check,
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


# ---------------------------------------------------------------------------------- the main combo: commits moved

MAIN_NIGHT1 = {**NIGHT1, "peft": "0.22.0.dev0", "transformers": "5.24.0.dev0", "accelerate": "1.16.0.dev0"}


def sourced(repo: str, commit: str) -> Dict[str, Any]:
    return {"url": repo, "ref": "main", "commit": commit, "dirty": None, "release": "0.21.2"}


def main_night(path: Path, verdicts: Dict[str, str], peft_commit: str, tf_commit: str = "t" * 40) -> Path:
    """A night of the ``main`` combo: versions say .dev0 whatever the commit; the column's sources say which."""
    night(path, MAIN_NIGHT1, verdicts, column="main")
    data = json.loads(path.read_text())
    data["columns"][0]["versions"]["peft"] = f"0.22.0.dev0 @ {peft_commit[:7]}"
    data["columns"][0]["sources"] = {
        "peft": sourced("https://github.com/huggingface/peft", peft_commit),
        "transformers": sourced("https://github.com/huggingface/transformers", tf_commit),
    }
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def bisects(monkeypatch: pytest.MonkeyPatch) -> List[Dict[str, Any]]:
    calls: List[Dict[str, Any]] = []

    def fake(combo, package, good, bad, held, cells, args):
        calls.append({"combo": combo.id, "package": package, "good": good["commit"], "bad": bad["commit"]})
        calls[-1].update(held=held, cells=cells, url=bad["url"])
        commit = {"sha": "c" * 40, "subject": "FIX the wrap policy (#3001)", "date": "2026-11-24T01:00:00", "pr": 3001}
        return {"commits": 7, "cells": {c: {"commit": commit} for c in cells}, "installs": 4, "install_bound": 5}

    monkeypatch.setattr(nightly, "check_commits", fake)
    return calls


def test_main_commits_moved_and_a_verdict_changed_runs_the_commit_bisect_and_names_the_pr(
    tmp_path, upgrades, bisects
) -> None:
    old = main_night(tmp_path / "old.json", {CELL_FIX: "reproduced", CELL_SAME: "fix-holds"}, "a" * 40)
    new = main_night(tmp_path / "new.json", {CELL_FIX: "UNEXPECTED-FIX", CELL_SAME: "fix-holds"}, "b" * 40)
    code, summary = run(tmp_path, old, new)
    assert code == 0 and upgrades == [], "a source column's .dev0 versions are never an upgrade check"
    # only peft moved: it is bisected from last night's commit to tonight's, transformers held at tonight's commit
    # and the floating releases at tonight's versions
    assert bisects == [
        {
            "combo": "main",
            "package": "peft",
            "good": "a" * 40,
            "bad": "b" * 40,
            "url": "https://github.com/huggingface/peft",
            "cells": [CELL_FIX],
            "held": [
                "torch==2.15.0",
                "accelerate==1.16.0.dev0",
                "bitsandbytes==0.50.2",
                f"transformers=https://github.com/huggingface/transformers@{'t' * 40}",
            ],
        }
    ]
    assert "### Commit bisect for `main`: peft aaaaaaaaaa -> bbbbbbbbbb (7 commits)" in summary
    row = f"| `{CELL_FIX}` | reproduced | UNEXPECTED-FIX | **cccccccccc** FIX the wrap policy (#3001) | #3001 |"
    assert row in summary
    saved = json.loads((tmp_path / "n.json").read_text())
    assert saved["upgrades"][0]["commit_bisect"]["cells"][CELL_FIX]["commit"]["pr"] == 3001


def test_main_same_commits_or_no_changed_cell_no_commit_bisect(tmp_path, upgrades, bisects) -> None:
    old = main_night(tmp_path / "old.json", {CELL_FIX: "reproduced"}, "a" * 40)
    same = main_night(tmp_path / "same.json", {CELL_FIX: "UNEXPECTED-FIX"}, "a" * 40)
    run(tmp_path, old, same)
    moved = main_night(tmp_path / "moved.json", {CELL_FIX: "reproduced"}, "b" * 40)
    run(tmp_path, old, moved)
    crashed = main_night(tmp_path / "crashed.json", {CELL_FIX: "crash"}, "b" * 40)
    run(tmp_path, old, crashed)
    assert bisects == [] and upgrades == []


@pytest.mark.bisect
@pytest.mark.heavy  # 5 commit steps with real installs and launches: 2-7 min here (nox -s heavy)
@pytest.mark.timeout(1300)
def test_two_nights_over_a_toy_repo_bisect_the_commits_for_real(tmp_path) -> None:
    """Two fake nights of a combo built from a toy repo's main (tests/sources_support.py): c0 with the bug last
    night, c5 with it fixed tonight. The nightly runs the real commit bisect (bisect/commits.py: clean snapshot per
    commit, step envs, a real 2-rank cell) and writes the fixing commit and its PR into the step summary."""
    from fsdp_matrix.cells import expand
    from fsdp_matrix.matrix import load_matrix
    from tests.bisect.test_commits import TOY_CASE
    from tests.sources_support import make_toy_repo

    repo = tmp_path / "toypkg"
    shas = make_toy_repo(repo)
    pins = load_matrix().combo("old").pins.model_dump()
    matrix = {
        "combos": [{"id": "toy", "pins": pins, "sources": {"toypkg": f"{repo}@main"}, "tags": ["test"]}],
        "cases": [
            {
                "id": "toy-bug",
                "title": "the toy package's bug",
                "report": "tests/sources_support.py",
                "repro": "toy_case.py",
                "grids": [{"toy": ["plain"]}],
                "expect": [{"error": {"type": "RuntimeError", "match": "toy bug present"}, "source": "the toy repo"}],
            }
        ],
    }
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    (tmp_path / "toy_case.py").write_text(TOY_CASE)
    [cell] = [c.key for c in expand(load_matrix(tmp_path / "matrix.yaml"), "cpu", 2)]

    def toy_night(path: Path, commit: str, verdict: str) -> Path:
        night(path, {**pins, "torch": pins["torch"] + "+cpu"}, {cell: verdict}, column="toy")
        data = json.loads(path.read_text())
        data["columns"][0]["sources"] = {"toypkg": sourced(str(repo), commit)}
        path.write_text(json.dumps(data))
        return path

    old = toy_night(tmp_path / "old.json", shas["c0"], "reproduced")
    new = toy_night(tmp_path / "new.json", shas["c5"], "UNEXPECTED-FIX")
    summary = tmp_path / "summary.md"
    argv = [str(old), str(new), "--summary", str(summary), "--json", str(tmp_path / "n.json")]
    code = nightly.main(argv + ["--matrix", str(tmp_path / "matrix.yaml"), "--cache", str(tmp_path / "cache")])
    text = summary.read_text()
    print(text)
    assert code == 0
    assert f"### Commit bisect for `toy`: toypkg {shas['c0'][:10]} -> {shas['c5'][:10]} (6 commits)" in text
    assert f"| `{cell}` | reproduced | UNEXPECTED-FIX | **{shas['c4'][:10]}** Fix the toy bug (#42) | #42 |" in text
    result = json.loads((tmp_path / "n.json").read_text())["upgrades"][0]["commit_bisect"]
    assert result["first_changed"] == shas["c4"] and result["untestable"] == [shas["c3"]]
    assert result["installs"] <= install_bound(6)


def test_a_flip_its_reruns_do_not_repeat_is_flaky_no_alert_no_upgrade_check(tmp_path, upgrades, monkeypatch) -> None:
    from fsdp_matrix.confirm import confirm

    def fake(flips, envs, args):
        return confirm(flips, lambda ask: dict.fromkeys(ask.cells, "fix-holds"), [], args.reruns)

    monkeypatch.setattr(nightly, "confirm_flips", fake)
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds", CELL_SAME: "fix-holds"})
    new = night(tmp_path / "new.json", {**NIGHT1, "peft": "0.22.1"}, {CELL_FIX: "REGRESSION", CELL_SAME: "fix-holds"})
    code, summary = run(tmp_path, old, new)
    assert code == 0 and upgrades == [], "a flaky flip rings nobody and sends no bisect"
    assert "NEW REGRESSIONS" not in summary
    assert "Flaky: reruns did not repeat the flip (no alert, not bisected) (1):" in summary
    assert "REGRESSION (flaky)" in summary
    assert "1 flipped cells rerun (1 flaky): 2 fresh launches, 2 cell runs." in summary
    saved = json.loads((tmp_path / "n.json").read_text())
    assert saved["confirmed"] == [
        {
            "column": "newest",
            "cell": CELL_FIX,
            "status": "flaky",
            "previous": "fix-holds",
            "reruns": ["fix-holds", "fix-holds"],
            "at_previous": [],
        }
    ]


def test_reruns_below_two_are_refused_in_one_line(tmp_path, upgrades, capsys) -> None:
    old = night(tmp_path / "old.json", NIGHT1, {CELL_FIX: "fix-holds"})
    with pytest.raises(SystemExit) as exc:
        nightly.main([str(old), str(old), "--reruns", "1"])
    assert exc.value.code == 2 and "at least 2 reruns" in capsys.readouterr().err


@pytest.mark.parametrize("how, code, said", [("sigint", 130, "interrupted"), ("sigterm", 143, "terminated")])
def test_ctrl_c_and_sigterm_end_the_launch_and_say_so_in_one_line(monkeypatch, capsys, tmp_path, how, code, said):
    """Ctrl-C ended the nightly in a KeyboardInterrupt traceback, and SIGTERM killed it without the ``finally`` that
    ends a rerun's or a bisect's running launch."""
    from tests.helpers import interrupted_in_one_line, interrupting

    ended: List[bool] = []
    monkeypatch.setattr(nightly, "nightly", interrupting(how, ended))
    argv = [str(tmp_path / "old.json"), str(tmp_path / "new.json")]
    interrupted_in_one_line(nightly.main, argv, capsys, code, said, ended)
