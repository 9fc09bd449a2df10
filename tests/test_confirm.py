"""Confirm before alerting: the decision on fake reruns, then a night with one flaky and one broken cell for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import yaml

from fsdp_matrix import confirm
from fsdp_matrix.confirm import CONFIRMED, FLAKY, NOT_THE_SOURCES, PREVIOUS, TONIGHT, UNCONFIRMED, Flip, RerunAsk

FLIP = Flip("newest", "case/cell-ws2", "fix-holds", "REGRESSION")


@pytest.mark.parametrize(
    ("reruns", "at_previous", "status"),
    [
        (["REGRESSION", "REGRESSION"], [], CONFIRMED),
        (["REGRESSION", "fix-holds"], [], FLAKY),
        (["hang", "REGRESSION"], [], FLAKY),
        ([None, None], [], UNCONFIRMED),
        ([None, "REGRESSION"], [], CONFIRMED),
        (["REGRESSION", "REGRESSION"], ["fix-holds", "fix-holds"], CONFIRMED),
        (["REGRESSION", "REGRESSION"], ["REGRESSION", "REGRESSION"], NOT_THE_SOURCES),
        (["REGRESSION", "REGRESSION"], ["fix-holds", "REGRESSION"], FLAKY),
    ],
)
def test_decide(reruns: List[Optional[str]], at_previous: List[Optional[str]], status: str) -> None:
    got = confirm.decide(FLIP, reruns, at_previous)
    assert got.status == status and got.reruns == reruns and got.previous == "fix-holds"


def test_confirm_reruns_each_column_in_fresh_launches_and_at_the_previous_commits_where_sources_moved() -> None:
    flips = [
        Flip("main", "a/flaky-ws2", "fix-holds", "crash"),
        Flip("main", "a/broken-ws2", "fix-holds", "REGRESSION"),
        Flip("newest", "b/fixed-ws2", "reproduced", "UNEXPECTED-FIX"),
    ]
    asks: List[RerunAsk] = []

    def rerun(ask: RerunAsk) -> Dict[str, Optional[str]]:
        asks.append(ask)
        if ask.at == PREVIOUS:
            return {"a/broken-ws2": "fix-holds", "a/flaky-ws2": "fix-holds"}
        return {"a/flaky-ws2": "fix-holds", "a/broken-ws2": "REGRESSION", "b/fixed-ws2": "UNEXPECTED-FIX"}

    got = confirm.confirm(flips, rerun, moved=["main"])
    assert got.status("main", "a/flaky-ws2") == FLAKY
    assert got.status("main", "a/broken-ws2") == CONFIRMED
    assert got.status("newest", "b/fixed-ws2") == CONFIRMED
    # main: 2 launches tonight + 2 at last night's commits, both cells each time; newest: 2 launches tonight only
    assert [(a.column, a.at, a.attempt, len(a.cells)) for a in asks] == [
        ("main", TONIGHT, 1, 2),
        ("main", TONIGHT, 2, 2),
        ("main", PREVIOUS, 1, 2),
        ("main", PREVIOUS, 2, 2),
        ("newest", TONIGHT, 1, 1),
        ("newest", TONIGHT, 2, 1),
    ]
    assert (got.launches, got.cell_runs) == (6, 10)
    assert "3 flipped cells rerun (2 confirmed, 1 flaky): 6 fresh launches, 10 cell runs" in confirm.cost_note(got)


def test_one_rerun_is_not_a_confirmation() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        confirm.confirm([FLIP], lambda ask: {}, runs=1)


# ------------------------------------------------------------------------- a real night: one flaky, one broken

FLAKY_CASE = '''"""Fails the first time it runs, then passes: a marker file next to it remembers the first run."""

from pathlib import Path

CASE = "toy-flaky"


def run(params, ctx):
    marker = Path(__file__).with_name("flaky-ran-once")
    if not marker.exists():
        marker.write_text("ran")
        raise RuntimeError("flaky: fails once")
    return {}
'''
BROKEN_CASE = '''"""Broken for good."""

CASE = "toy-broken"


def run(params, ctx):
    raise RuntimeError("broken for good")
'''


def _toy_matrix(root: Path) -> Path:
    from fsdp_matrix.matrix import load_matrix

    pins = load_matrix().combo("old").pins.model_dump()
    cases = [
        {
            "id": case,
            "title": f"a {case} cell",
            "report": "tests/test_confirm.py",
            "repro": f"{case.replace('-', '_')}.py",
            "grids": [{"n": [1]}],
            "expect": [{"ok": True, "source": "it should train"}],
        }
        for case in ("toy-flaky", "toy-broken")
    ]
    (root / "toy_flaky.py").write_text(FLAKY_CASE)
    (root / "toy_broken.py").write_text(BROKEN_CASE)
    (root / "matrix.yaml").write_text(yaml.safe_dump({"combos": [{"id": "toy", "pins": pins}], "cases": cases}))
    return root / "matrix.yaml"


@pytest.mark.heavy  # nox -s heavy: a long end-to-end run
@pytest.mark.timeout(600)
def test_a_flaky_cell_is_recorded_flaky_and_only_the_broken_one_alerts_and_is_bisected(tmp_path, monkeypatch) -> None:
    """Tonight (a real launch) both cells fail where they trained last night. The nightly reruns each twice in fresh
    launches (real ones, in this test's env): the flaky cell passes, so it is listed apart, raises no alert, gets no
    upgrade check, and its record says flaky; the broken one fails again, alerts and gets the upgrade check."""
    from fsdp_matrix.bisect import nightly, rerun
    from fsdp_matrix.cells import expand
    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.records import iter_records, latest
    from tests.bisect.test_nightly import night

    matrix = _toy_matrix(tmp_path)
    cells = {c.case: c.key for c in expand(load_matrix(matrix), "cpu", 1)}
    results = tmp_path / "tonight"
    run = [sys.executable, "-m", "fsdp_matrix", "run", *cells.values(), "--matrix", str(matrix)]
    run += ["--results", str(results), "--combo", "toy", "--device", "cpu", "--world-size", "1"]
    subprocess.run(run, check=False, timeout=300)
    tonight = {k: r.verdict for (_, k), r in latest(iter_records(results)).items()}
    assert tonight == {cells["toy-flaky"]: "REGRESSION", cells["toy-broken"]: "REGRESSION"}
    [rec] = list(latest(iter_records(results)).values())[:1]
    last_night = {k: v for k, v in rec.versions.items() if k != "python"}
    old = night(
        tmp_path / "old.json", {**last_night, "peft": "0.9.0"}, dict.fromkeys(cells.values(), "fix-holds"), "toy"
    )

    # the reruns' env: this test's own (the harness is installed in it); the launches are real
    monkeypatch.setattr(rerun, "rerun_env", lambda ask, envs, installer: Path(sys.prefix))
    upgrades: List[List[str]] = []
    monkeypatch.setattr(nightly, "check_upgrade", lambda base, bumps, cases, args: upgrades.append(cases) or {})
    summary, out = tmp_path / "summary.md", tmp_path / "n.json"
    argv = [str(old), str(results), "--matrix", str(matrix), "--cache", str(tmp_path / "cache"), "--world-size", "1"]
    code = nightly.main(argv + ["--summary", str(summary), "--json", str(out)])
    text = summary.read_text()
    print(text)
    assert code == 1, "the broken cell alerts"
    assert upgrades == [["toy-broken"]], "only the confirmed flip is bisected"
    assert "NEW REGRESSIONS (1):" in text
    assert f"{cells['toy-broken']}: F fix-holds -> !R REGRESSION (confirmed)" in text
    assert f"{cells['toy-flaky']}: F fix-holds -> !R REGRESSION (flaky)" in text
    assert "Flaky: reruns did not repeat the flip (no alert, not bisected) (1):" in text
    assert "2 flipped cells rerun (1 confirmed, 1 flaky): 2 fresh launches, 4 cell runs." in text
    marked = {k: r.confirmation for (_, k), r in latest(iter_records(results)).items()}
    assert marked[cells["toy-flaky"]].status == FLAKY and marked[cells["toy-flaky"]].reruns == ["fix-holds"] * 2
    assert marked[cells["toy-broken"]].status == CONFIRMED
    assert marked[cells["toy-broken"]].reruns == ["REGRESSION", "REGRESSION"]
    saved = {f["cell"]: f["status"] for f in json.loads(out.read_text())["confirmed"]}
    assert saved == {cells["toy-flaky"]: FLAKY, cells["toy-broken"]: CONFIRMED}


# ------------------------------------------------------------------- the gate's stricter reading (decide_gate)


def _failing(v: str) -> bool:
    return v not in ("fix-holds", "reproduced", "UNEXPECTED-FIX")


@pytest.mark.parametrize(
    ("first_base", "first_head", "base_reruns", "head_reruns", "status", "base"),
    [
        # the base reruns judge the flip, not the first (cached) base run
        ("REGRESSION", "crash", ["fix-holds", "fix-holds"], ["crash", "crash"], confirm.CONFIRMED, "fix-holds"),
        ("hang", "REGRESSION", ["fix-holds", "fix-holds"], ["REGRESSION"] * 2, confirm.CONFIRMED, "fix-holds"),
        # the base gives the head's verdict too: not the pull request's doing
        ("fix-holds", "REGRESSION", ["REGRESSION"] * 2, ["REGRESSION"] * 2, NOT_THE_SOURCES, "REGRESSION"),
        # the head does not repeat: flaky, unless it fails where the base never does (the PR made it flaky)
        ("fix-holds", "REGRESSION", ["fix-holds"] * 2, ["fix-holds", "REGRESSION"], "made-flaky", "fix-holds"),
        ("fix-holds", "REGRESSION", ["fix-holds", "hang"], ["fix-holds", "REGRESSION"], FLAKY, "fix-holds"),
        ("reproduced", "UNEXPECTED-FIX", ["reproduced"] * 2, ["reproduced"] * 2, FLAKY, "reproduced"),
        # reruns that could not run: the first runs stand
        ("fix-holds", "REGRESSION", [None, None], [None, None], UNCONFIRMED, "fix-holds"),
    ],
)
def test_decide_gate(first_base, first_head, base_reruns, head_reruns, status, base) -> None:
    got = confirm.decide_gate(first_base, first_head, base_reruns, head_reruns, _failing)
    assert (got.status, got.base) == (status, base)


def test_the_nightly_reading_is_kept() -> None:
    """The nightly still calls a head that does not repeat flaky, whatever the base reruns say."""
    assert confirm.decide(FLIP, ["REGRESSION", "fix-holds"], ["fix-holds", "fix-holds"]).status == FLAKY
