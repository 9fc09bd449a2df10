"""pytest front end: one test per cell, all cells of a pytest process (or xdist worker) in shared launches.

A test passes exactly when the observed outcome matches the expected one (reproduced / fix-holds). Any other
verdict fails with ``expected … / observed …`` and each rank's traceback or stack; skipped cells are pytest skips
that carry their reason.

Each cell's test carries its verdict, expected and observed signatures and the versions as ``user_properties``
(``record_properties``): pytest writes them into ``--report-log`` (pytest-reportlog) and ``--junitxml`` alike, the
formats upstream CI scripts read (docs/pages/upstream-ci.md). Markers ``cpu_gate`` and ``gpu_nightly`` select the
gate and the nightly (``gate_marks``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, List, Optional, Tuple

import pytest

from fsdp_matrix import options
from fsdp_matrix.cells import Cell, expand
from fsdp_matrix.errors import MatrixError, ResultsError
from fsdp_matrix.expectations import Expected
from fsdp_matrix.installed import uncovered
from fsdp_matrix.matrix import Matrix, load_matrix
from fsdp_matrix.options import LaunchOptions
from fsdp_matrix.records import Record
from fsdp_matrix.report.failure import failure_text
from fsdp_matrix.runner.factory import open_session, resolve_device, run_layout
from fsdp_matrix.runner.session import Session
from fsdp_matrix.verdicts import Verdict

OPTIONS = pytest.StashKey[LaunchOptions]()
"""The validated launch options of this pytest run."""
MATRIX = pytest.StashKey[Matrix]()
"""The parsed matrix.yaml, loaded once."""


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("fsdp-matrix", "PEFT x FSDP reproduction matrix")
    # validated in pytest_configure (typed=False): one ERROR line naming the option, not pytest's usage text
    options.add_arguments(g.addoption, defaults={"device": "auto"}, typed=False)
    g.addoption("--progress-line", action="store_true", help="print 'combo: N/M cells, elapsed' as cells finish")


def _options(config: pytest.Config) -> LaunchOptions:
    if OPTIONS not in config.stash:
        try:
            config.stash[OPTIONS] = options.from_namespace(config.option)
        except options.OptionError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[OPTIONS]


def _device(config: pytest.Config) -> str:
    return resolve_device(_options(config).device)


def _layout(config: pytest.Config, device: str) -> tuple:
    """(world size, nodes) of the cells whose grid pins none: the run's (factory.run_layout)."""
    return run_layout(_options(config), device)


def _matrix(config: pytest.Config) -> Matrix:
    if MATRIX not in config.stash:
        try:
            config.stash[MATRIX] = load_matrix(_options(config).matrix)
        except MatrixError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[MATRIX]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell: a matrix cell run on a multi-rank torchrun launch")
    config.addinivalue_line(
        "markers",
        "layout: a cell whose grid pins its own world size or node count (4 ranks, 2 nodes): a launch of its own; "
        "deselect with -m 'not layout'",
    )
    config.addinivalue_line("markers", f"cpu_gate: {GATE_HELP}")
    config.addinivalue_line("markers", f"gpu_nightly: {NIGHTLY_HELP}")
    _options(config)
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
    """The case ids of ``--cases``, each checked against matrix.yaml: a typo must not select zero cells silently.
    A combo that names its own ``cases`` keeps only those (possibly none); None: every case."""
    ids = _options(config).cases
    matrix = _matrix(config)
    for case_id in ids or ():
        try:
            matrix.case(case_id)
        except MatrixError as exc:
            raise pytest.UsageError(f"--cases: {exc}") from None
    combo = _options(config).combo
    own = next((c.cases for c in matrix.combos if c.id == combo), None) if combo else None
    if own:
        return [c for c in (ids or own) if c in own]
    return ids or None


def pytest_sessionstart(session: pytest.Session) -> None:
    # validate before collection: a collection error would bury the one line that names the bad key
    _matrix(session.config)
    _cases(session.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    config = metafunc.config
    device = _device(config)
    world_size, nodes = _layout(config, device)
    cases = _cases(config)
    cells = [] if cases == [] else expand(_matrix(config), device, world_size, cases, nodes)
    default = (world_size, nodes)
    metafunc.parametrize(
        "cell",
        [
            pytest.param(
                c,
                id=c.key,
                marks=[pytest.mark.cell, *([pytest.mark.layout] if c.layout != default else []), *gate_marks(c)],
            )
            for c in cells
        ],
    )


GATE_HELP = (
    "a cell of the CPU gate: 2 ranks on one node on CPU (gloo), no torch.compile; every such cell of the old combo "
    "ran in minutes on 2 cores (docs/pages/upstream-ci.md)"
)
NIGHTLY_HELP = "a cell of the GPU nightly: every cell on cuda (nccl), at the world sizes the visible GPUs allow"


def gate_marks(cell: Cell) -> List[Any]:
    """``cpu_gate`` for a CPU cell of 2 ranks on one node without torch.compile (a compile cell restarts the ranks
    and compiles for tens of seconds: it belongs to the full matrix); ``gpu_nightly`` for every cuda cell."""
    if cell.device == "cuda":
        return [pytest.mark.gpu_nightly]
    if cell.layout == (2, 1) and cell.params_dict.get("compile", "none") == "none":
        return [pytest.mark.cpu_gate]
    return []


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Cells of one layout (world size, nodes) next to each other, the run's own first, each in its order: a
    session keeps one launch per layout, and stops one when the next layout's cells start. Within a layout the
    ``compile`` cells come last: torch.compile patches ``torch.nn.Module.__init__`` for good, so the ranks restart
    after each one, and a cell after the last of them would pay a fresh launch (about 13 s on 2 cores)."""
    order: dict = {}

    def rank(item: pytest.Item) -> tuple:
        cell = getattr(getattr(item, "callspec", None), "params", {}).get("cell")
        if not isinstance(cell, Cell):
            return (0, False)
        layout = order.setdefault(cell.layout, len(order) + 1) if item.get_closest_marker("layout") else 0
        return (layout, cell.params_dict.get("compile", "none") != "none")

    items.sort(key=rank)  # stable: every other test keeps its place


@pytest.fixture(scope="session")
def matrix_session(request: pytest.FixtureRequest) -> Session:
    config = request.config
    opts = _options(config)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        session = open_session(opts, _matrix(config), launches=opts.results / "launches" / worker)
    except ResultsError as exc:
        pytest.exit(f"fsdp-matrix: {exc}", returncode=pytest.ExitCode.INTERRUPTED)
    if not hasattr(config, "workerinput"):
        # without xdist this process runs every collected cell, in collection order: queue them all now
        cells = _collected_cells(request.session)
        session.prefetch(cells)
        say_uncovered(config, session, cells)
    yield session
    session.close()


def say_uncovered(config: pytest.Config, session: Session, cells: List[Cell]) -> None:
    """One terminal line per cell no rule of matrix.yaml covers at the installed versions, before any runs: it
    fails (DIFFERENT-ERROR), and the line says why up front (fsdp_matrix.installed.uncovered)."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    for line in uncovered((c.key, session.expected(c)) for c in cells):
        if tr is not None:
            tr.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A cell whose record cannot be written, or whose launch directory was removed, stops the whole run with the
    one line that names the path: every later cell would run only to lose its verdict too."""
    try:
        return (yield)
    except ResultsError as exc:
        pytest.exit(f"fsdp-matrix: {exc}", returncode=pytest.ExitCode.INTERRUPTED)


def _collected_cells(session: pytest.Session) -> List[Cell]:
    return [
        item.callspec.params["cell"]
        for item in session.items
        if hasattr(item, "callspec") and isinstance(item.callspec.params.get("cell"), Cell)
    ]


def _signature(data: dict) -> str:
    return json.dumps({k: v for k, v in data.items() if v not in (None, "", [], {})}, sort_keys=True)


def record_properties(rec: Record) -> List[Tuple[str, str]]:
    """What a report-log line or a JUnit ``<properties>`` of a cell says: its verdict, the expected and observed
    signatures, the versions and source builds, as text (JSON for the structured ones): the same in both formats."""
    obs = rec.observed
    message = (obs.error_message or "").strip().splitlines()
    observed = {"status": obs.status, "error_type": obs.error_type, "location": obs.location}
    observed["message"] = message[0][:300] if message else None
    expected = Expected.from_json(rec.expected)
    return [
        ("cell", rec.key),
        ("verdict", rec.verdict),
        ("expected", expected.describe()),
        ("expected_signature", _signature({k: rec.expected.get(k) for k in ("kind", "error_type", "match", "module")})),
        ("observed_signature", _signature(observed)),
        ("line", rec.line),
        ("rule_source", expected.source or ""),
        ("versions", json.dumps(rec.versions, sort_keys=True)),
        ("sources", json.dumps(rec.sources, sort_keys=True)),
        ("combo", rec.combo or ""),
        ("device", rec.device),
        ("world_size", str(rec.world_size)),
    ]


def check_record(rec: Record, item: Optional[pytest.Item] = None) -> None:
    """Pass, skip or fail the cell's test by its verdict; given the test's item (``request.node``), first stamp the
    record's properties on it (``record_properties``). Appended to ``user_properties`` as ``record_property`` does,
    without its warning under JUnit's default xunit2 family (pytest writes them there all the same)."""
    if item is not None:
        item.user_properties.extend(record_properties(rec))
    verdict = Verdict(rec.verdict)
    if verdict is Verdict.SKIPPED:
        pytest.skip(rec.observed.error_message or "skipped")
    if not verdict.passed:
        pytest.fail(failure_text(rec), pytrace=False)
