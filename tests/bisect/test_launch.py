"""LaunchRunner against a fake env: its ``python -m fsdp_matrix run`` writes real records and prints per-cell lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fsdp_matrix.bisect.launch import LaunchRunner
from fsdp_matrix.bisect.search import Outcome, Untestable

# stands in for <venv>/bin/python: answers `-m fsdp_matrix run CELL ... --results DIR --combo C` like the real command
FAKE_RUN = r"""#!{python}
import sys, time
from pathlib import Path
from fsdp_matrix.records import Observed, Record, append, env_error
args = sys.argv[1:]
assert args[:3] == ["-m", "fsdp_matrix", "run"], args
cells, rest = [], args[3:]
while rest and not rest[0].startswith("--"):
    cells.append(rest.pop(0))
opts = dict(zip(rest[::2], rest[1::2]))
Path(opts["--results"]).parent.mkdir(parents=True, exist_ok=True)
with open(Path(opts["--results"]).parent / "launches.txt", "a") as fh:
    fh.write(" ".join(cells) + "\n")
for key in cells:
    case, cell = key.split("/")
    if "broken" in cell:
        obs, verdict = env_error("import failed"), "env-error"
    elif "fixed" in cell:
        obs, verdict = Observed(status="ok"), "fix-holds"
    else:
        obs, verdict = Observed(status="error", error_type="ValueError", error_message="at 0x7f00 bad"), "reproduced"
    append(Path(opts["--results"]), Record(case=case, cell=cell, params={{}}, versions={{}}, device="cpu", world_size=2,
        expected={{}}, observed=obs, verdict=verdict, duration_s=0.1, combo=opts["--combo"]))
    print(f"{{verdict:16}} {{key}}  expected ... / observed ...", flush=True)
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    env = tmp_path / "env-abc"
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python"
    python.write_text(FAKE_RUN.format(python=sys.executable))
    python.chmod(0o755)
    return env


def test_runs_all_cells_in_one_launch_reports_progress_and_reuses_records(venv: Path, tmp_path: Path) -> None:
    said = []
    runner = LaunchRunner(tmp_path / "cache", say=said.append)
    cells = ["case/a-fixed-ws2", "case/b-ws2", "case/c-broken-ws2"]
    got = runner.run_cells(venv, "base", cells)
    assert got["case/a-fixed-ws2"] == Outcome("ok", verdict="fix-holds")
    assert got["case/b-ws2"] == Outcome.observed("error", "ValueError", "at 0x1 bad", "reproduced")
    assert isinstance(got["case/c-broken-ws2"], Untestable)
    assert any(s.startswith("base: 2/3 reproduced case/b-ws2") for s in said), said
    launches = (tmp_path / "cache" / "results" / "launches.txt").read_text().splitlines()
    assert launches == [" ".join(cells)]
    # a second ask for the same env: everything is recorded already, so no launch at all
    again = runner.run_cells(venv, "base", cells[:2])
    assert again == {c: got[c] for c in cells[:2]} and runner.launches == 1
    # a new cell runs alone
    runner.run_cells(venv, "base", cells + ["case/d-fixed-ws2"])
    assert (tmp_path / "cache" / "results" / "launches.txt").read_text().splitlines()[-1] == "case/d-fixed-ws2"


def test_no_record_at_all_is_untestable(tmp_path: Path) -> None:
    env = tmp_path / "env-dead"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\necho 'torchrun died before any cell ran'\nexit 3\n")
    (env / "bin" / "python").chmod(0o755)
    with pytest.raises(Untestable, match="torchrun died"):
        LaunchRunner(tmp_path / "cache", say=lambda s: None).run_cells(env, "x", ["case/a-ws2"])
