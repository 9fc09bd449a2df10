"""The upgrade check with installs and launches faked: which cells changed, shared bisect steps, which package."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest

from fsdp_matrix.bisect import upgrade
from fsdp_matrix.bisect.installers import InstallLog, PinnedInstaller
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import Outcome, Prepared
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import load_matrix

FIXTURE = Path(__file__).parent / "fixtures" / "bisect_matrix.yaml"
PEFT = ["0.13.2", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.17.0", "0.17.1"]
TF = ["4.46.3", "4.47.0", "4.47.1", "4.48.0", "4.49.0"]
RELEASES = {"peft": PEFT, "transformers": TF}

Verdicts = Callable[[str, Dict[str, str]], str]


def v(text: str) -> tuple:
    return tuple(int(p) for p in text.split("."))


class FakeInstaller:
    """Hands out one fake env per pin set and logs it the way PinnedInstaller does."""

    def __init__(self, combo, broken: Sequence[str] = (), unbuildable: Callable[[Dict[str, str]], bool] = None) -> None:
        self.combo, self.broken = combo, set(broken)
        self.unbuildable = unbuildable or (lambda pins: False)
        self.log: List[InstallLog] = []
        self.pins_of: Dict[Path, Dict[str, str]] = {}

    def install(self, pins, extra) -> Prepared:
        bad = pins["peft"] in self.broken or self.unbuildable(pins)
        self.log.append(InstallLog(dict(pins), not bad, False, 0.0))
        if bad:
            return Prepared(None, f"peft {pins['peft']}: no wheel for this Python")
        env = Path(f"/envs/{len(self.pins_of)}")
        self.pins_of[env] = dict(pins)
        return Prepared(env)


class FakeRunner:
    """Each cell's verdict is a function of the env's pins; every call is one launch."""

    def __init__(self, installer: FakeInstaller, verdict: Verdicts) -> None:
        self.installer, self.verdict = installer, verdict
        self.launches: List[tuple] = []

    def run_cells(self, env: Path, candidate: str, cells: Sequence[str]):
        pins = self.installer.pins_of[env]
        self.launches.append((tuple(sorted(pins.items())), tuple(cells)))
        return {
            c: Outcome("ok" if self.verdict(c, pins) == "fix-holds" else "error", verdict=self.verdict(c, pins))
            for c in cells
        }


def candidates(package: str, old: str, new: str, pre: bool) -> List[str]:
    for end in (old, new):  # as release_candidates: both ends must be releases on the index
        if end not in RELEASES[package]:
            raise EnvError(f"{package} {end} is not an installable release on the configured indexes")
    return [r for r in RELEASES[package] if v(old) <= v(r) <= v(new)]


def check(base: str, bumps: Dict[str, str], verdict: Verdicts, cells: Sequence[str], broken=(), unbuildable=None):
    combo = load_matrix(FIXTURE).combo(base)
    installer = FakeInstaller(combo, broken, unbuildable)
    runner = FakeRunner(installer, verdict)
    result = upgrade.run_upgrade(combo, bumps, cells, installer, runner, candidates=candidates)
    return result, installer, runner


CELLS = [f"case/cell-{i}" for i in range(6)]


def peft_rule(flips: Dict[str, str]) -> Verdicts:
    """Cells in ``flips`` go from reproduced to fix-holds at the given peft release; the others never change."""

    def verdict(cell: str, pins: Dict[str, str]) -> str:
        at = flips.get(cell)
        return "fix-holds" if at and v(pins["peft"]) >= v(at) else "reproduced"

    return verdict


def test_changed_cells_share_every_bisect_step() -> None:
    flips = {CELLS[0]: "0.15.1", CELLS[1]: "0.15.1", CELLS[2]: "0.15.1"}
    result, installer, runner = check("old", {"peft": "0.17.1"}, peft_rule(flips), CELLS)
    assert [c.cell for c in result.changed] == CELLS[:3]
    for c in result.changed:
        assert (c.base_verdict, c.target_verdict) == ("reproduced", "fix-holds")
        assert (c.first_changed, c.last_unchanged) == ({"peft": "0.15.1"}, {"peft": "0.15.0"})
    # one env per pin set, and every step ran all three cells in one launch
    assert len(installer.log) == len({tuple(sorted(log.pins.items())) for log in installer.log}) == result.installs
    steps = runner.launches[2:]
    assert steps and all(cells == tuple(CELLS[:3]) for _, cells in steps)
    assert result.installs <= math.ceil(math.log2(len(PEFT))) + 2 == result.install_bound
    one, _, _ = check("old", {"peft": "0.17.1"}, peft_rule({CELLS[0]: "0.15.1"}), CELLS)
    assert one.installs == result.installs, "three cells that changed together must cost what one costs"


def test_cells_that_changed_at_different_releases_each_get_theirs() -> None:
    flips = {CELLS[0]: "0.14.0", CELLS[3]: "0.17.0"}
    result, installer, _ = check("old", {"peft": "0.17.1"}, peft_rule(flips), CELLS)
    found = {c.cell: (c.first_changed["peft"], c.last_unchanged["peft"]) for c in result.changed}
    assert found == {CELLS[0]: ("0.14.0", "0.13.2"), CELLS[3]: ("0.17.0", "0.16.0")}
    assert len(installer.log) == result.installs


def test_seed_003_shape_needs_only_base_and_target() -> None:
    # peft 0.13.2 -> 0.14.0 has two candidates: base and target are the bisection's ends, nothing more to install
    result, installer, runner = check("old", {"peft": "0.14.0"}, peft_rule({CELLS[1]: "0.14.0"}), CELLS)
    assert [(c.cell, c.first_changed, c.last_unchanged) for c in result.changed] == [
        (CELLS[1], {"peft": "0.14.0"}, {"peft": "0.13.2"})
    ]
    assert result.installs == 2 and len(runner.launches) == 2 and result.install_bound == 3


def test_uninstallable_release_is_stepped_around() -> None:
    result, installer, _ = check("old", {"peft": "0.17.1"}, peft_rule({CELLS[0]: "0.16.0"}), CELLS, broken=["0.15.2"])
    (c,) = result.changed
    assert c.first_changed == {"peft": "0.16.0"}
    assert any(not log.ok for log in installer.log)


def test_several_bumps_each_cell_is_pinned_on_its_package() -> None:
    def verdict(cell: str, pins: Dict[str, str]) -> str:
        peft, tf = v(pins["peft"]), v(pins["transformers"])
        if cell == CELLS[0]:  # a peft fix
            return "fix-holds" if peft >= v("0.15.0") else "reproduced"
        if cell == CELLS[1]:  # a transformers regression
            return "REGRESSION" if tf >= v("4.48.0") else "fix-holds"
        if cell == CELLS[2]:  # needs both: only the revert-from-target test sees it
            return "fix-holds" if peft >= v("0.14.0") and tf >= v("4.47.1") else "reproduced"
        return "reproduced"

    result, installer, _ = check("old", {"peft": "0.17.1", "transformers": "4.49.0"}, verdict, CELLS)
    found = {c.cell: (c.first_changed, c.last_unchanged) for c in result.changed}
    assert found[CELLS[0]] == ({"peft": "0.15.0"}, {"peft": "0.14.0"})
    assert found[CELLS[1]] == ({"transformers": "4.48.0"}, {"transformers": "4.47.1"})
    assert found[CELLS[2]] == (
        {"peft": "0.14.0", "transformers": "4.47.1"},
        {"peft": "0.13.2", "transformers": "4.47.0"},
    )
    assert "others held at the target" in next(c.answer for c in result.changed if c.cell == CELLS[2])
    assert [c.cell for c in result.regressions] == [CELLS[1]]
    assert len(installer.log) == result.installs <= result.install_bound


def test_defect2_an_attribution_env_that_cannot_be_built_falls_through_and_keeps_the_diff() -> None:
    """Peft 0.17.1 needs transformers >= 4.49, so "base with peft 0.17.1 only" cannot be built.
    That context cannot attribute the cell; the revert-alone context can, and the base/target diff is kept."""

    def verdict(cell: str, pins: Dict[str, str]) -> str:
        return "fix-holds" if cell == CELLS[0] and v(pins["peft"]) >= v("0.15.0") else "reproduced"

    def unbuildable(pins: Dict[str, str]) -> bool:
        return v(pins["peft"]) >= v("0.17.0") and v(pins["transformers"]) < v("4.49.0")

    bumps = {"peft": "0.17.1", "transformers": "4.49.0"}
    result, installer, _ = check("old", bumps, verdict, CELLS, unbuildable=unbuildable)
    (c,) = result.changed
    assert (c.cell, c.base_verdict, c.target_verdict) == (CELLS[0], "reproduced", "fix-holds")
    assert c.first_changed == {"peft": "0.15.0"} and c.last_unchanged == {"peft": "0.14.0"}
    assert "others held at the target" in c.answer
    # with two bumps both attribution envs are "one bumped alone": neither can be built, the diff stays
    mixed = {("0.17.1", "4.46.3"), ("0.13.2", "4.49.0")}
    alone, _, _ = check("old", bumps, verdict, CELLS, unbuildable=lambda p: (p["peft"], p["transformers"]) in mixed)
    (c,) = alone.changed
    assert c.first_changed == {} and "the bumps act together" in c.answer


def test_review24_attribution_stops_once_every_changed_cell_is_explained() -> None:
    """Review item 24: after peft alone explained every changed cell, "base with transformers 4.49.0 only" was
    still installed and run; and the installs line gave its bound without "plus skips"."""

    def verdict(cell: str, pins: Dict[str, str]) -> str:
        return "fix-holds" if cell == CELLS[0] and v(pins["peft"]) >= v("0.15.0") else "reproduced"

    bumps = {"peft": "0.17.1", "transformers": "4.49.0"}
    result, installer, _ = check("old", bumps, verdict, CELLS, broken=["0.15.1"])
    base = load_matrix(FIXTURE).combo("old").pins.model_dump()
    assert {**base, "transformers": "4.49.0"} not in [log.pins for log in installer.log]
    assert result.changed[0].first_changed == {"peft": "0.15.0"}
    assert f"bound {result.install_bound} plus skips" in upgrade.render(result)


def test_no_change_installs_only_base_and_target() -> None:
    result, installer, _ = check("old", {"peft": "0.17.1"}, peft_rule({}), CELLS)
    assert result.changed == [] and result.installs == 2


def test_unpinned_package_is_refused() -> None:
    with pytest.raises(Exception, match="not pinned by combo old"):
        check("old", {"numpy": "2.0.0"}, peft_rule({}), CELLS)


# ------------------------------------------------------------------------------------------------------ the CLI


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List]:
    seen: Dict[str, List] = {"pins": []}
    envs: Dict[Path, Dict[str, str]] = {}

    def install(self: PinnedInstaller, pins, extra) -> Prepared:
        seen["pins"].append(dict(pins))
        env = Path(f"/envs/{len(envs)}")
        envs[env] = dict(pins)
        self.log.append(InstallLog(dict(pins), True, False, 0.0))
        return Prepared(env)

    def run_cells(self: LaunchRunner, env: Path, candidate: str, cells: Sequence[str]):
        peft = v(envs[env]["peft"])
        out = {}
        for cell in cells:
            if "shape_plain" in cell:
                fixed = peft >= v("0.14.0")
                out[cell] = (
                    Outcome("ok", verdict="fix-holds") if fixed else Outcome("error", "Exception", "x", "reproduced")
                )
            elif peft >= v("0.14.0"):
                out[cell] = Outcome("error", "TypeError", "y", "REGRESSION")
            else:
                out[cell] = Outcome("ok", verdict="fix-holds")
        return out

    monkeypatch.setattr(PinnedInstaller, "install", install)
    monkeypatch.setattr(LaunchRunner, "run_cells", run_cells)
    monkeypatch.setattr(upgrade, "release_candidates", candidates)
    return seen


def test_cli_prints_changes_writes_json_and_exits_1_on_a_regression(faked, tmp_path, capsys) -> None:
    out = tmp_path / "up.json"
    argv = ["peft==0.14.0", "--combo", "old", "--matrix", str(FIXTURE), "--cache", str(tmp_path), "--json", str(out)]
    assert upgrade.main(argv) == 1
    text = capsys.readouterr().out
    assert "cells changed verdict" in text and "first changed: peft 0.14.0" in text
    data = json.loads(out.read_text())
    assert data["base"]["combo"] == "old" and data["base"]["pins"]["peft"] == "0.13.2"
    assert data["target"]["pins"]["peft"] == "0.14.0"
    unset = [c for c in data["changed"] if "shape_plain" in c["cell"]]
    assert unset and all(
        (c["base_verdict"], c["target_verdict"], c["first_changed"], c["last_unchanged"])
        == ("reproduced", "fix-holds", {"peft": "0.14.0"}, {"peft": "0.13.2"})
        for c in unset
    )
    assert any(c["target_verdict"] == "REGRESSION" for c in data["changed"])
    assert data["installs"] == 2 and data["install_bound"] == 3


def test_cli_checks_cases(faked, tmp_path, capsys) -> None:
    argv = ["peft==0.14.0", "--combo", "old", "--matrix", str(FIXTURE), "--cache", str(tmp_path)]
    assert upgrade.main(argv + ["--cases", "no-split-modules"]) == 1
    assert upgrade.main(argv + ["--cases", "no-such-case"]) == 2
    assert "no case 'no-such-case'" in capsys.readouterr().err


def test_defect6_a_bump_given_twice_equal_to_the_base_or_not_on_the_index_is_refused_before_the_base_runs(
    faked, tmp_path, capsys
) -> None:
    """These printed "0 changed" and exited 0, or failed only after the base run."""
    argv = ["--combo", "old", "--matrix", str(FIXTURE), "--cache", str(tmp_path)]
    for bumps, line in (
        (["peft==0.13.2"], "peft==0.13.2 is already the base's pin"),
        (["peft==0.14.0", "peft==0.13.2"], "peft given twice"),
        (["PEFT==0.13.2", "Peft==0.14.0"], "peft given twice"),
        (["peft==0.14.*"], "exact version"),
        (["peft==0.99.0"], "peft 0.99.0 is not an installable release"),
    ):
        assert upgrade.main(bumps + argv) == 2, bumps
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1, (bumps, err)
    assert faked["pins"] == [], "nothing may be installed or run on the base before the target is checked"


def test_defect15_unusable_json_and_cache_paths_are_one_line_before_the_run(faked, tmp_path, capsys) -> None:
    """``--json DIR`` was an IsADirectoryError after the whole run, ``--cache FILE`` a
    FileExistsError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = ["peft==0.14.0", "--combo", "old", "--matrix", str(FIXTURE)]
    for extra, line in (
        (["--cache", str(tmp_path / "c"), "--json", str(tmp_path)], f"--json {tmp_path}: is a directory"),
        (["--cache", str(afile)], f"--cache {afile}"),
    ):
        assert upgrade.main(argv + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1, err
    assert faked["pins"] == []


@pytest.mark.parametrize("how, code, said", [("sigint", 130, "interrupted"), ("sigterm", 143, "terminated")])
def test_ctrl_c_and_sigterm_end_the_launch_and_say_so_in_one_line(monkeypatch, capsys, tmp_path, how, code, said):
    """Ctrl-C ended the upgrade check in a KeyboardInterrupt traceback, and SIGTERM killed it without the
    ``finally`` that ends the running launch (the commit bisect's handling, which upgrade lacked)."""
    from tests.helpers import interrupted_in_one_line, interrupting

    ended: List[bool] = []
    monkeypatch.setattr(upgrade, "run_upgrade", interrupting(how, ended))
    argv = ["peft==0.14.0", "--combo", "old", "--matrix", str(FIXTURE), "--cache", str(tmp_path)]
    interrupted_in_one_line(upgrade.main, argv, capsys, code, said, ended)


def test_an_expected_error_replaced_by_another_is_a_change_found_at_its_release() -> None:
    """upgrade compared verdicts: reproduced on both ends with another error was invisible, and a bisect step
    with the same verdict counted as unchanged, so "last unchanged" quoted the base's error."""
    combo = load_matrix(FIXTURE).combo("old")
    installer = FakeInstaller(combo)

    class ErrorRunner(FakeRunner):
        def run_cells(self, env: Path, candidate: str, cells: Sequence[str]):
            pins = self.installer.pins_of[env]
            self.launches.append((tuple(sorted(pins.items())), tuple(cells)))
            old = v(pins["peft"]) < v("0.15.1")
            err = ("ValueError", "uniform requires_grad") if old else ("RuntimeError", "size mismatch")
            return {c: Outcome("error", *err, verdict="reproduced") if c == CELLS[0] else Outcome("ok") for c in cells}

    result = upgrade.run_upgrade(
        combo, {"peft": "0.17.1"}, CELLS, installer, ErrorRunner(installer, None), candidates=candidates
    )
    (c,) = result.changed
    assert (c.base_verdict, c.target_verdict) == ("reproduced", "reproduced")
    assert (c.first_changed, c.last_unchanged) == ({"peft": "0.15.1"}, {"peft": "0.15.0"})
    assert "ValueError: uniform requires_grad" in c.base_outcome and "RuntimeError: size mismatch" in c.target_outcome
    text = upgrade.render(result)
    assert "R -> R  changed at: peft 0.15.1" in text and "target: reproduced (RuntimeError: size mismatch)" in text
