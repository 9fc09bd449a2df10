"""The bisect Runner's contract with ``python -m fsdp_matrix run``: it reads the record back, or says why it cannot."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from fsdp_matrix.bisect.runner import CellRunner
from fsdp_matrix.bisect.search import Outcome, Untestable
from fsdp_matrix.records import Observed, Record

CELL = "no-split-modules/shape_plain-ws2"


def _fake_venv(tmp: Path, body: str) -> Path:
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "python"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nargs = sys.argv[1:]\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return venv


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
        f"assert args[:4] == ['-m', 'fsdp_matrix', 'run', {CELL!r}], args\n"
        + "assert args[args.index('--device') + 1] == 'cpu' and args[args.index('--world-size') + 1] == '2'\n"
        + "res = args[args.index('--results') + 1]\n"
        + f"open(res + '/cells.jsonl', 'a').write({json.dumps(rec.to_json())!r} + '\\n')\n"
    )


def test_runner_reads_the_record(tmp_path: Path) -> None:
    obs = Observed(
        status="error",
        error_type="Exception",
        error_message="Could not find the transformer layer class to wrap in the model.",
    )
    venv = _fake_venv(tmp_path, _record_writer(obs))
    outcome = CellRunner(CELL, workdir=tmp_path).run(venv, "0.13.2")
    assert outcome == Outcome.observed("error", "Exception", obs.error_message)


@pytest.mark.parametrize("status", ["skipped", "env-error"])
def test_runner_cannot_test_a_skipped_or_env_error_cell(tmp_path: Path, status: str) -> None:
    venv = _fake_venv(tmp_path, _record_writer(Observed(status=status, error_message="no peft")))
    with pytest.raises(Untestable, match=status):
        CellRunner(CELL, workdir=tmp_path).run(venv, "0.13.2")


def test_runner_without_a_record_is_untestable(tmp_path: Path) -> None:
    venv = _fake_venv(
        tmp_path, "sys.stderr.write('ModuleNotFoundError: No module named fsdp_matrix.runner.worker')\nsys.exit(1)"
    )
    with pytest.raises(Untestable, match=r"no record .* \(exit 1\): ModuleNotFoundError.*fsdp_matrix.runner.worker"):
        CellRunner(CELL, workdir=tmp_path).run(venv, "0.13.2")


def test_runner_backstop_timeout_is_a_hang(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, "import time\ntime.sleep(30)")
    assert CellRunner(CELL, timeout=1, workdir=tmp_path).run(venv, "0.13.2") == Outcome("hang")


def test_runner_backstop_takes_down_the_launch_in_its_own_session(tmp_path: Path) -> None:
    """Defect 11: the backstop killed the run's process group, but torchrun starts its own session (as the launcher
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
    runner = CellRunner(CELL, timeout=3, workdir=tmp_path)
    try:
        assert runner.run(venv, "0.13.2") == Outcome("hang")
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
