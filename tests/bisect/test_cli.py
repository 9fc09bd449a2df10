"""The bisect command with the installs and launches faked: argument handling, table, --json, --by-date."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest

from fsdp_matrix.bisect import cli as bisect_cli
from fsdp_matrix.bisect.installers import DatedInstaller, InstallLog, PinnedInstaller
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import Prepared
from fsdp_matrix.matrix import load_matrix
from tests.helpers import interrupted_in_one_line, interrupting

FIXTURE = Path(__file__).parent / "fixtures" / "bisect_matrix.yaml"
CELL = "no-split-modules/shape_plain-ws2"
BUG = Outcome.observed("error", "Exception", "Could not find the transformer layer class to wrap in the model.")
PEFT = ["0.13.2", "0.14.0", "0.15.0", "0.15.1", "0.15.2"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List]:
    """Installs record their pins; the cell errors before peft 0.14.0 and trains from then on."""
    seen: Dict[str, List] = {"pins": [], "runs": []}

    def install(self: PinnedInstaller, pins: Dict[str, str], extra: List[str]) -> Prepared:
        seen["pins"].append(dict(pins))
        # as the cache would: the base release's env is already there
        self.log.append(InstallLog(dict(pins), True, pins["peft"] == "0.13.2", 0.0))
        return Prepared(Path(f"/envs/{pins['peft']}"))

    def run_cells(self: LaunchRunner, env: Path, candidate: str, cells: List[str]) -> Dict[str, Outcome]:
        seen["runs"].append((cells[0], self.world_size, candidate))
        return {cells[0]: BUG if env.name < "0.14.0" else Outcome("ok")}

    monkeypatch.setattr(PinnedInstaller, "install", install)
    monkeypatch.setattr(LaunchRunner, "run_cells", run_cells)
    monkeypatch.setattr(bisect_cli, "release_candidates", lambda name, old, new, pre: PEFT)
    return seen


def test_newest_cpu_combo_is_the_default() -> None:
    assert load_matrix(FIXTURE).newest("cpu").id == "current"


def test_bisect_prints_table_answer_and_writes_json(fake, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r" / "bisect.json"
    code = bisect_cli.main(
        [
            CELL,
            "--package",
            "peft",
            "--old",
            "0.13.2",
            "--new",
            "0.15.2",
            "--combo",
            "old",
            "--pin",
            "accelerate==1.2.1",
            "--matrix",
            str(FIXTURE),
            "--cache",
            str(tmp_path),
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "first changed: peft 0.14.0 (last unchanged: 0.13.2)" in text
    assert "0.14.0  yes        ok <- first changed" in text
    # a reused env was counted as an install
    assert "4 steps: 3 envs installed, 1 reused from the cache, 0 skipped" in text
    data = json.loads(out.read_text())
    assert {k: data[k] for k in ("package", "old", "new", "first_changed", "last_unchanged", "combo", "cell")} == {
        "package": "peft",
        "old": "0.13.2",
        "new": "0.15.2",
        "first_changed": "0.14.0",
        "last_unchanged": "0.13.2",
        "combo": "old",
        "cell": CELL,
    }
    assert [s["candidate"] for s in data["steps"]] == ["0.13.2", "0.15.2", "0.15.0", "0.14.0"]
    # combo pins, overridden by --pin, then by the candidate
    assert all(p["transformers"] == "4.46.3" and p["accelerate"] == "1.2.1" for p in fake["pins"])
    assert fake["runs"][0] == (CELL, 2, "0.13.2")


def test_no_change_exits_zero_and_says_so(fake, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(LaunchRunner, "run_cells", lambda self, env, c, cells: {cells[0]: BUG})
    assert (
        bisect_cli.main([CELL, "--package", "peft", "--old", "0.13.2", "--new", "0.15.2", "--matrix", str(FIXTURE)])
        == 0
    )
    assert "no change: peft 0.13.2 and 0.15.2 both give Exception" in capsys.readouterr().out


def test_missing_arguments_and_unknown_cell(fake, capsys) -> None:
    with pytest.raises(SystemExit):
        bisect_cli.main([CELL, "--package", "peft", "--matrix", str(FIXTURE)])
    assert (
        bisect_cli.main(["no-such/cell-ws2", "--package", "peft", "--old", "1", "--new", "2", "--matrix", str(FIXTURE)])
        == 2
    )
    assert "no cell" in capsys.readouterr().err


def test_by_date_reports_the_day_and_what_changed(
    fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    def resolve(self: DatedInstaller, day: str) -> Dict[str, str]:
        peft = "0.13.2" if day < "2024-12-06" else "0.14.0"
        self.resolutions[day] = {"torch": "2.13.0+cpu", "peft": peft, "transformers": "4.47.0", "tqdm": "4.67.1"}
        return self.resolutions[day]

    monkeypatch.setattr(DatedInstaller, "resolve", resolve)
    out = tmp_path / "d.json"
    assert (
        bisect_cli.main(
            [
                CELL,
                "--by-date",
                "2024-11-20",
                "2024-12-20",
                "--combo",
                "old",
                "--matrix",
                str(FIXTURE),
                "--cache",
                str(tmp_path),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "first changed: 2024-12-06 (last unchanged: 2024-12-05)" in text
    assert "changed between 2024-12-05 and 2024-12-06: peft 0.13.2 -> 0.14.0" in text
    data = json.loads(out.read_text())
    assert data["package"] == "date" and data["changed_packages"] == ["peft 0.13.2 -> 0.14.0"]
    assert len(data["steps"]) <= 2 + 5  # 31 days: ceil(log2 31) + 2
    assert all(p["torch"] == "2.13.0+cpu" for p in fake["pins"])


def test_defect6_a_pin_on_the_bisected_package_is_refused(fake, capsys) -> None:
    """``--pin peft==0.12.0 --package peft`` was ignored without a word."""
    argv = [CELL, "--package", "peft", "--old", "0.13.2", "--new", "0.15.2", "--matrix", str(FIXTURE)]
    assert bisect_cli.main(argv + ["--pin", "PEFT==0.12.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "peft is the package being bisected" in err and len(err.splitlines()) == 1
    assert fake["pins"] == []


@pytest.mark.parametrize(
    "extra, line",
    [
        (["--package", "peft", "--old", "abc", "--new", "0.15.2"], "--old 'abc': not a version"),
        (["--package", "peft", "--old", "0.13.2", "--new", "0.15.x"], "--new '0.15.x': not a version"),
        (["--by-date", "2024-13-01", "2025-01-01"], "--by-date '2024-13-01': expected a date YYYY-MM-DD"),
        (["--by-date", "2024-12-01", "yesterday"], "--by-date 'yesterday': expected a date YYYY-MM-DD"),
    ],
)
def test_defect15_bad_versions_and_dates_are_one_line(fake, capsys, extra, line) -> None:
    """``--old abc`` ended in an InvalidVersion traceback, ``--by-date 2024-13-01`` in
    ``ValueError: month must be in 1..12``."""
    assert bisect_cli.main([CELL, *extra, "--matrix", str(FIXTURE)]) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and len(err.splitlines()) == 1 and fake["pins"] == []


def test_defect15_unusable_cache_and_json_paths_are_one_line_before_anything_runs(fake, tmp_path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = [CELL, "--package", "peft", "--old", "0.13.2", "--new", "0.15.2", "--matrix", str(FIXTURE)]
    for extra, line in (
        (["--cache", str(afile)], f"--cache {afile}"),
        (["--cache", str(tmp_path / "c"), "--json", str(tmp_path)], f"--json {tmp_path}: is a directory"),
        (["--cache", str(tmp_path / "c"), "--json", str(afile / "x.json")], f"--json {afile / 'x.json'}"),
    ):
        assert bisect_cli.main(argv + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1, err
    assert fake["pins"] == [] and fake["runs"] == []


def test_defect17_a_cell_skipped_on_the_combo_is_said_before_installing_anything(fake, capsys) -> None:
    """Both ends were installed, the cell was skipped in both, and the answer was "no candidate
    between peft 0.13.2 and 0.14.0 could be installed"."""
    skip = Path(__file__).parent / "fixtures" / "bisect_skip_matrix.yaml"
    argv = [CELL, "--package", "peft", "--old", "0.13.2", "--new", "0.15.2", "--combo", "old", "--matrix", str(skip)]
    assert bisect_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "the cell is skipped on this combo: this fixture's cells need transformers 5" in err
    assert len(err.splitlines()) == 1 and fake["pins"] == [] and fake["runs"] == []
    # on a combo where it runs, the same matrix bisects as usual
    assert bisect_cli.main(argv[:-3] + ["current", "--matrix", str(skip)]) in (0, 1)
    assert fake["pins"]


@pytest.mark.parametrize("how, code, said", [("sigint", 130, "interrupted"), ("sigterm", 143, "terminated")])
def test_ctrl_c_and_sigterm_end_the_launch_and_say_so_in_one_line(monkeypatch, capsys, how, code, said) -> None:
    """Ctrl-C ended in a 20-line KeyboardInterrupt traceback; SIGTERM killed the bisect and left its launch running
    unsupervised (the launch is ended by the ``finally`` of the step that runs it: SIGTERM must take that path)."""
    from fsdp_matrix.bisect import commits

    ended = []
    monkeypatch.setattr(commits, "run", interrupting(how, ended))
    argv = [CELL, "--package", "peft", "--git", "/nonexistent", "--good", "a", "--bad", "b", "--matrix", str(FIXTURE)]
    interrupted_in_one_line(bisect_cli.main, argv, capsys, code, said, ended)
