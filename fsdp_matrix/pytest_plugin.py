"""pytest front end: one test per cell, all cells of a pytest process (or xdist worker) in shared launches.

A test passes exactly when the observed outcome matches the expected one (reproduced / fix-holds). Any other
verdict fails with ``expected … / observed …`` and each rank's traceback or stack; skipped cells are pytest skips
that carry their reason.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

from fsdp_matrix.cells import Cell, expand
from fsdp_matrix.envs import local_versions
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix, load_matrix
from fsdp_matrix.records import Record
from fsdp_matrix.report.failure import failure_text
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.session import Session
from fsdp_matrix.verdicts import Verdict


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("fsdp-matrix", "PEFT x FSDP reproduction matrix")
    g.addoption("--results", default="results", help="directory for cells.jsonl (default: results/)")
    g.addoption("--matrix", default=None, help="matrix.yaml to use (default: the repo's)")
    g.addoption(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="cpu (gloo) or cuda (nccl); auto picks cuda when a GPU is visible",
    )
    g.addoption("--world-size", type=int, default=None, help="ranks per launch (default 2; on one GPU, 1)")
    g.addoption("--combo", default=None, help="matrix.yaml combo id this env was built for (set by nox)")
    g.addoption("--cases", default=None, help="comma-separated case ids to run (default: all)")
    g.addoption(
        "--resume",
        action="store_true",
        help="keep cells whose newest record in --results is an outcome (not env-error, hang or crash); run the rest",
    )
    g.addoption("--cell-timeout", type=float, default=180.0, help="seconds before a cell counts as hung (default 180)")
    g.addoption("--progress-line", action="store_true", help="print 'combo: N/M cells, elapsed' as cells finish")
    g.addoption(
        "--torchrun-args",
        default=None,
        help="rendezvous options passed to torchrun instead of --standalone, e.g. for multi-node",
    )


def _device(config: pytest.Config) -> str:
    device = config.getoption("--device")
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"


def _world_size(config: pytest.Config, device: str) -> int:
    given = config.getoption("--world-size")
    if given:
        return given
    if device == "cuda":
        import torch

        return max(1, min(2, torch.cuda.device_count()))
    return 2


def _matrix(config: pytest.Config) -> Matrix:
    if not hasattr(config, "_fsdp_matrix"):
        path = config.getoption("--matrix")
        try:
            config._fsdp_matrix = load_matrix(path)
        except MatrixError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config._fsdp_matrix


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell: a matrix cell run on a multi-rank torchrun launch")
    if config.getoption("--progress-line") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Progress(config), "fsdp-matrix-progress")


class Progress:
    """One line per finished cell: which combo, how many cells done out of how many, time so far."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.label = config.getoption("--combo") or "local"
        self.total = 0
        self.done = 0
        self.start = time.monotonic()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = sum(1 for item in session.items if item.get_closest_marker("cell"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "cell" in report.keywords and (report.when == "call" or (report.when == "setup" and not report.passed)):
            self.done += 1
            tr = self.config.pluginmanager.get_plugin("terminalreporter")
            if tr is not None:
                tr.write_line(
                    f"[{self.label}] {self.done}/{self.total or '?'} cells, "
                    f"{time.monotonic() - self.start:.0f}s elapsed: "
                    f"{report.nodeid.split('[', 1)[-1][:-1]} {report.outcome}"
                )


def _cases(config: pytest.Config) -> Optional[List[str]]:
    """The case ids of ``--cases``, each checked against matrix.yaml: a typo must not select zero cells silently."""
    given = config.getoption("--cases")
    if not given:
        return None
    ids = [c.strip() for c in given.split(",") if c.strip()]
    matrix = _matrix(config)
    for case_id in ids:
        try:
            matrix.case(case_id)
        except MatrixError as exc:
            raise pytest.UsageError(f"--cases: {exc}") from None
    return ids


def pytest_sessionstart(session: pytest.Session) -> None:
    # validate before collection: a collection error would bury the one line that names the bad key
    _matrix(session.config)
    _cases(session.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    config = metafunc.config
    device = _device(config)
    cells = expand(_matrix(config), device, _world_size(config, device), _cases(config))
    metafunc.parametrize("cell", [pytest.param(c, id=c.key, marks=pytest.mark.cell) for c in cells])


@pytest.fixture(scope="session")
def matrix_session(request: pytest.FixtureRequest) -> Session:
    config = request.config
    device = _device(config)
    world_size = _world_size(config, device)
    results = Path(config.getoption("--results"))
    matrix_path = Path(config.getoption("--matrix") or DEFAULT_MATRIX)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    torchrun_args = (
        shlex.split(config.getoption("--torchrun-args")) if config.getoption("--torchrun-args") else ["--standalone"]
    )
    launcher = Launcher(
        run_root=results / "launches" / worker,
        device=device,
        world_size=world_size,
        cell_timeout=config.getoption("--cell-timeout"),
        torchrun_args=torchrun_args,
        python=sys.executable,
    )
    session = Session(
        _matrix(config),
        launcher,
        results,
        local_versions(),
        combo=config.getoption("--combo"),
        resume=config.getoption("--resume"),
        repo_root=matrix_path.resolve().parent,
    )
    if not hasattr(config, "workerinput"):
        # without xdist this process runs every collected cell, in collection order: queue them all now
        session.prefetch(_collected_cells(request.session))
    yield session
    session.close()


def _collected_cells(session: pytest.Session) -> List[Cell]:
    return [
        item.callspec.params["cell"]
        for item in session.items
        if hasattr(item, "callspec") and isinstance(item.callspec.params.get("cell"), Cell)
    ]


def check_record(rec: Record) -> None:
    verdict = Verdict(rec.verdict)
    if verdict is Verdict.SKIPPED:
        pytest.skip(rec.observed.error_message or "skipped")
    if not verdict.passed:
        pytest.fail(failure_text(rec), pytrace=False)
