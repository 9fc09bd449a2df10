"""The bisect Runner's contract with ``python -m fsdp_matrix run``: it reads the records back, or says why it cannot.

One cell with ``bare`` outcomes (what ``bisect`` searches with) and several cells on one launch (what ``upgrade``
uses), both against fake envs whose ``python`` answers like the real command."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import Untestable
from fsdp_matrix.records import Observed, Record

CELL = "no-split-modules/shape_plain-ws2"


def _fake_venv(tmp: Path, body: str) -> Path:
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "python"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nargs = sys.argv[1:]\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return venv


class _One:
    """One cell on a bare LaunchRunner, as the release bisect runs it: its Outcome, or Untestable raised."""

    def __init__(self, runner: LaunchRunner) -> None:
        self.runner = runner

    def run(self, env: Path, candidate: str) -> Outcome:
        got = self.runner.run_cells(env, candidate, [CELL])[CELL]
        if isinstance(got, Untestable):
            raise got
        return got


def _one(tmp: Path, timeout: float = 900) -> _One:
    return _One(LaunchRunner(tmp / "cache", timeout=timeout, resume=False, say=lambda s: None, bare=True))


def _record_writer(observed: Observed) -> str:
    rec = Record(
        case="no-split-modules",
        cell="shape_plain-ws2",
        params={"shape": "plain"},
        versions={},
        device="cpu",
        world_size=2,
        expected={"kind": "ok"},
        observed=observed,
        verdict="reproduced",
        duration_s=1.0,
    )
    return (
        "assert args[:4] == ['-m', 'fsdp_matrix', 'run', '--cells-file'], args\n"
        + f"assert open(args[4]).read().split() == [{CELL!r}]\n"
        + "assert args[args.index('--device') + 1] == 'cpu' and args[args.index('--world-size') + 1] == '2'\n"
        + "res = args[args.index('--results') + 1]\n"
        + f"rec = json.loads({json.dumps(rec.to_json())!r})\n"
        + "rec['combo'] = args[args.index('--combo') + 1]\n"
        + "open(res + '/cells.jsonl', 'a').write(json.dumps(rec) + '\\n')\n"
    )


def test_runner_reads_the_record(tmp_path: Path) -> None:
    obs = Observed(
        status="error",
        error_type="Exception",
        error_message="Could not find the transformer layer class to wrap in the model.",
    )
    venv = _fake_venv(tmp_path, _record_writer(obs))
    outcome = _one(tmp_path).run(venv, "0.13.2")
    assert outcome == Outcome.observed("error", "Exception", obs.error_message)


@pytest.mark.parametrize("status", ["skipped", "env-error"])
def test_runner_cannot_test_a_skipped_or_env_error_cell(tmp_path: Path, status: str) -> None:
    venv = _fake_venv(tmp_path, _record_writer(Observed(status=status, error_message="no peft")))
    with pytest.raises(Untestable, match=status):
        _one(tmp_path).run(venv, "0.13.2")


def test_runner_without_a_record_is_untestable(tmp_path: Path) -> None:
    venv = _fake_venv(
        tmp_path, "sys.stderr.write('ModuleNotFoundError: No module named fsdp_matrix.runner.worker')\nsys.exit(1)"
    )
    with pytest.raises(Untestable, match=r"no record .* \(exit 1\): ModuleNotFoundError.*fsdp_matrix.runner.worker"):
        _one(tmp_path).run(venv, "0.13.2")


def test_defect17_runner_backstop_timeout_is_untestable_never_a_hang(tmp_path: Path) -> None:
    """The harness's own --timeout was recorded as the cell's ``hang``, so a bisection whose ends
    both hit it answered "no change ... both give hang" with exit 0."""
    venv = _fake_venv(tmp_path, "import time\ntime.sleep(30)")
    with pytest.raises(Untestable, match=r"--timeout \(1s\) ran out"):
        _one(tmp_path, timeout=1).run(venv, "0.13.2")


def test_runner_backstop_takes_down_the_launch_in_its_own_session(tmp_path: Path) -> None:
    """The backstop killed the run's process group, but torchrun starts its own session (as the launcher
    does, with the launch marker and directory a real run has), so it and its ranks survived."""
    import os
    import time

    import psutil

    from fsdp_matrix.runner import procs

    body = (
        "import os, subprocess, time\n"
        "res = args[args.index('--results') + 1]\n"
        "os.makedirs(res + '/launches/cli/launch-0-backstop0test', exist_ok=True)\n"
        f"env = dict(os.environ, {procs.MARKER}='backstop0test')\n"
        # like torchrun: its own session, its output to its own file (not the run's pipes)
        "p = subprocess.Popen(['sleep', '300'], env=env, start_new_session=True, stdout=subprocess.DEVNULL,\n"
        "                     stderr=subprocess.DEVNULL)\n"
        f"open({str(tmp_path / 'torchrun.pid')!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    venv = _fake_venv(tmp_path, body)
    runner = _one(tmp_path, timeout=3)
    try:
        with pytest.raises(Untestable, match="ran out"):
            runner.run(venv, "0.13.2")
        pid = int((tmp_path / "torchrun.pid").read_text())
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the launch outlived the backstop"
            time.sleep(0.1)
    finally:
        if (tmp_path / "torchrun.pid").exists():
            try:
                os.kill(int((tmp_path / "torchrun.pid").read_text()), 9)
            except ProcessLookupError:
                pass


# ------------------------------------------------------------------------------- several cells on one launch

# stands in for <venv>/bin/python: answers `-m fsdp_matrix run CELL ... --results DIR --combo C` like the real command
FAKE_RUN = r"""#!{python}
import sys, time
from pathlib import Path
from fsdp_matrix.records import Observed, Record, append, env_error
args = sys.argv[1:]
assert args[:3] == ["-m", "fsdp_matrix", "run"], args
rest = args[3:]
opts = dict(zip(rest[::2], rest[1::2]))
cells = Path(opts["--cells-file"]).read_text().split()
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
def launch_venv(tmp_path: Path) -> Path:
    env = tmp_path / "env-abc"
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python"
    python.write_text(FAKE_RUN.format(python=sys.executable))
    python.chmod(0o755)
    return env


def test_runs_all_cells_in_one_launch_reports_progress_and_reuses_records(launch_venv: Path, tmp_path: Path) -> None:
    said = []
    runner = LaunchRunner(tmp_path / "cache", say=said.append)
    cells = ["case/a-fixed-ws2", "case/b-ws2", "case/c-broken-ws2"]
    got = runner.run_cells(launch_venv, "base", cells)
    assert got["case/a-fixed-ws2"] == Outcome("ok", verdict="fix-holds")
    assert got["case/b-ws2"] == Outcome.observed("error", "ValueError", "at 0x1 bad", "reproduced")
    assert isinstance(got["case/c-broken-ws2"], Untestable)
    assert any(s.startswith("base: 2/3 reproduced case/b-ws2") for s in said), said
    launches = (tmp_path / "cache" / "results" / "launches.txt").read_text().splitlines()
    assert launches == [" ".join(cells)]
    # a second ask for the same env: everything is recorded already, so no launch at all
    again = runner.run_cells(launch_venv, "base", cells[:2])
    assert again == {c: got[c] for c in cells[:2]} and runner.launches == 1
    # a new cell runs alone
    runner.run_cells(launch_venv, "base", cells + ["case/d-fixed-ws2"])
    assert (tmp_path / "cache" / "results" / "launches.txt").read_text().splitlines()[-1] == "case/d-fixed-ws2"


def test_no_record_at_all_is_untestable(tmp_path: Path) -> None:
    env = tmp_path / "env-dead"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\necho 'torchrun died before any cell ran'\nexit 3\n")
    (env / "bin" / "python").chmod(0o755)
    with pytest.raises(Untestable, match="torchrun died"):
        LaunchRunner(tmp_path / "cache", say=lambda s: None).run_cells(env, "x", ["case/a-ws2"])


def test_several_cells_whose_launch_hits_the_backstop_are_untestable(tmp_path: Path) -> None:
    env = tmp_path / "env-slow"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\nsleep 30\n")
    (env / "bin" / "python").chmod(0o755)
    runner = LaunchRunner(tmp_path / "cache", timeout=1, resume=False, say=lambda s: None)
    with pytest.raises(Untestable, match="backstop --timeout ran out"):
        runner.run_cells(env, "x", ["case/a-ws2", "case/b-ws2"])


def test_defect15_cell_ids_go_to_the_launch_in_a_file_not_on_its_command_line(tmp_path: Path) -> None:
    """Review 2026-11-28: 80,000 cells ended in ``OSError: [Errno 7] Argument list too long`` (every id was an
    argument of the launch)."""
    runner = LaunchRunner(tmp_path / "cache", say=lambda s: None)
    cells = [f"case/cell{i}-ws2" for i in range(80_000)]
    argv = runner.command(tmp_path / "env-x", cells)
    assert not set(cells) & set(argv) and sum(map(len, argv)) < 2_000
    listed = Path(argv[argv.index("--cells-file") + 1])
    assert listed.read_text().split() == cells


def test_the_run_command_reads_its_cells_from_a_file_and_keeps_positional_ids(tmp_path: Path) -> None:
    from fsdp_matrix.runner.cli import cell_refs, parser

    listed = tmp_path / "cells.txt"
    listed.write_text("case/a-ws2\n\ncase/b-ws2\n")
    assert cell_refs(parser().parse_args(["case/z-ws2", "--cells-file", str(listed)])) == [
        "case/z-ws2", "case/a-ws2", "case/b-ws2"]  # fmt: skip
    assert cell_refs(parser().parse_args(["case/z-ws2"])) == ["case/z-ws2"]
