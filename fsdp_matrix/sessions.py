"""What the sessions of noxfile.py do with a combo, one call per session: its sources resolved, its pinned env
prepared (or env-error records written for the cells the run asked for), its floating pins resolved (``newest``,
``main``), and its cells run by pytest with an argv built through the options model (fsdp_matrix/options.py).

``session`` is nox's Session (``log``, ``error``, ``skip``, ``run``, ``notify``, ``posargs``, ``virtualenv``):
this module needs no nox of its own, so that noxfile.py stays a list of declarations.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from packaging.utils import canonicalize_name

from fsdp_matrix import envs, options
from fsdp_matrix.envs import failed, sources
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.matrix import Combo, Matrix
from fsdp_matrix.usage import flat

HERE = Path(__file__).resolve().parent.parent
"""The checkout noxfile.py is in."""
HARNESS = ["-e", str(HERE)]
"""The harness, installed editable into every combo env (its own deps resolve together with the pins)."""
BYTECODE = {"PYTHONDONTWRITEBYTECODE": None}
"""The self-tests write Python's bytecode caches even where the caller's environment says not to (nox drops a None
variable): they start hundreds of Python processes (ranks, CLI runs, pytest runs), and each one would compile this
package again, and pytest would rewrite the assertions of hypothesis's 80 modules again. Measured on 2 cores
(2026-11-27): 3 of the harness's test files took 60.4 s with PYTHONDONTWRITEBYTECODE=1, 47.9 s without. The caches
go beside the clone's sources and into its .nox envs, both of them the session's own."""
Built = Union[Dict[str, sources.Resolved], envs.EnvReport]
"""The packages built from source, resolved; or the env's error when the combo's own sources cannot be."""


def parser() -> options.Parser:
    """The launch options nox itself reads (declared once, in fsdp_matrix/options.py); the rest go to pytest."""
    p = options.Parser(prog="nox -s matrix --", add_help=False)
    # None: not given here, so nox picks (results root, GPU detection) and pytest gets nothing to override
    options.add_arguments(p.add_argument, ("results", "device", "world_size", "resume"), defaults=dict.fromkeys(
        ("results", "device"), None))  # fmt: skip
    p.add_argument("--pre", action="store_true", help="newest: let pre-releases count")
    p.add_argument("--pin", action="append", default=[], help="NAME=PATH_OR_URL[@REF] (from source) or NAME==VERSION")
    return p


def parse(posargs: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """(nox's options, pytest's arguments). A bad value stops the session with one line before any env is built."""
    opts, rest = parser().parse_known_args(list(posargs))
    if opts.device == "auto":
        opts.device = None
    if opts.world_size is not None:
        opts.world_size = str(opts.world_size)  # handed on to pytest as a word
    return opts, rest


def host_has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and envs.run_quiet(["nvidia-smi", "-L"]).startswith("GPU")


def stamp_extra() -> List[str]:
    # a reused env must be rebuilt when the harness's own requirements change
    return [f"pyproject={envs.requirements_hash([(HERE / 'pyproject.toml').read_text()])}"]


def with_releases(session: Any, combo: Combo, pins: Sequence[str]) -> Combo:
    """``--pin NAME==VERSION``: a release no combo pins replaces the combo's (the records keep the combo's id and
    hold the versions installed, and the rules are judged on those). A bad one: one line, exit 2."""
    from fsdp_matrix.bisect.installers import parse_pins

    try:
        return combo.with_pins(**parse_pins(pins)) if pins else combo
    except (EnvError, ValueError) as exc:
        print(f"nox -s {session.name} -- --pin: {flat(exc)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def resolve_sources(session: Any, combo: Combo, pins: Sequence[str] = ()) -> Built:
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


def prepare(session: Any, combo: Combo, device: str, extra: Sequence[str] = (), built=None) -> envs.EnvReport:
    """The combo's env in the session's virtualenv: the pins, the harness and ``extra``, with ``built``'s sources
    replacing their pins (resolved with the other pins, not --no-deps)."""
    start = time.monotonic()
    built = resolve_sources(session, combo) if built is None else built
    if isinstance(built, envs.EnvReport):
        return built
    if built:
        session.log(f"env {combo.id}: {sources.overlay_line(combo.pins.model_dump(), built)}")
    report = envs.prepare(
        Path(session.virtualenv.location), combo.pins.model_dump(), combo.extra, harness=HARNESS + list(extra),
        device=device, stamp_extra=stamp_extra(), allow_cuda_build=combo.allow_cuda_build, label=combo.id,
        sources=built,
    )  # fmt: skip
    what = "reused" if report.reused else f"installed in {report.install_s:.1f}s"
    if not report.ok:
        what = f"not ready after {report.install_s:.1f}s of installing"
    session.log(
        f"env {combo.id}: {what}, verified in {report.verify_s:.2f}s, setup {time.monotonic() - start:.2f}s total"
    )
    return report


def prepared(session: Any, combo: Combo, extra: Sequence[str] = ()) -> None:
    """The combo's CPU env for a session that runs the harness itself (tests, heavy, bench); the session's error
    when it cannot be built."""
    report = prepare(session, combo, "cpu", extra)
    if not report.ok:
        session.error(f"env-error for {combo.id}: {report.message}")


def env_error_records(
    session: Any, matrix: Matrix, combo: Combo, where: Tuple[Path, str, int], message: str,
    versions: Mapping[str, Optional[str]], pytest_args: Sequence[str], built: Optional[Built] = None,
) -> None:  # fmt: skip
    """A combo whose env cannot be built still gets one record per cell the run asked for (--cases, -k), saying why;
    ``where``: (results, device, world size); ``built``: the resolved sources it was to be built from, named in
    every record."""
    results, device, world_size = where
    try:
        cells, note = failed.selected_cells(matrix, device, world_size, pytest_args)
    except MatrixError as exc:
        session.error(f"--cases: {exc}")
    shown = {n: s.to_record() for n, s in built.items()} if isinstance(built, dict) else None
    failed.write_env_errors(matrix, combo.id, results, cells, message, versions, shown)
    session.log(f"env {combo.id}: {len(cells)} env-error records in {results}" + (f" ({note})" if note else ""))


def _device_of(session: Any, combo: Combo, device: Optional[str]) -> str:
    """The device this run is on; the session is skipped for a combo not tagged for it."""
    device = device or ("cuda" if host_has_gpu() else "cpu")
    wanted = "gpu" if device == "cuda" else "cpu"
    if device == "cuda" and wanted not in combo.tags:
        session.skip(f"{combo.id} is not tagged {wanted!r} (this run is on {device})")
    if device == "cpu" and not ({"cpu", "torch"} & set(combo.tags) or combo.floating):
        session.skip(f"{combo.id} is not tagged 'cpu' or 'torch' (this run is on {device})")
    return device


def run_combo(session: Any, matrix: Matrix, combo: Combo, results_root: Path, device: Optional[str] = None) -> None:
    """Every cell (or those pytest's arguments select) against one combo: sources, env, then the cells in one
    pytest run; env-error records and the session's error when the env cannot be built."""
    opts, rest = parse(session.posargs)
    device = _device_of(session, combo, device or opts.device)
    results = Path(opts.results or results_root) / combo.id
    combo = with_releases(session, combo, [p for p in opts.pin if "==" in p])
    built = resolve_sources(session, combo, [p for p in opts.pin if "==" not in p])
    report = prepare(session, combo, device, (), built)
    if not report.ok:
        # the pins stand in for what is installed: the record says what this combo was meant to be
        versions = {**combo.pins.model_dump(), **{k: v for k, v in report.versions.items() if v}}
        where = (results, device, int(opts.world_size or 2))
        env_error_records(session, matrix, combo, where, report.message, versions, rest, built)
        first = report.message.splitlines()[0] if report.message else ""
        if isinstance(built, dict) and built and report.message.startswith(("install failed", "import failed")):
            first = sources.failure_line(built, report.message)
        session.error(f"env-error for {combo.id}: {first}")
    launch = options.LaunchOptions(
        results=results, combo=combo.id, device=device, world_size=opts.world_size, resume=opts.resume
    )
    session.run(
        "python", "-m", "pytest", str(HERE / "tests" / "test_repros.py"), *pytest_argv(launch), "--progress-line",
        *rest, *options.to_argv(launch, ("world_size", "resume")),
    )  # fmt: skip


def pytest_argv(launch: options.LaunchOptions) -> List[str]:
    """``--results R --combo C --device D -p no:cacheprovider``: where a pytest run of cells records, through the
    options model."""
    return [*options.to_argv(launch, ("results", "combo", "device")), "-p", "no:cacheprovider"]


def run_pinned(session: Any, matrix: Matrix, combo: str, kind: str) -> None:
    """``nox -s matrix`` / ``nox -s torch``: one pinned combo, then the combined report (notified)."""
    root = HERE / "results" / kind
    notify_report(session, root)
    run_combo(session, matrix, matrix.combo(combo), root, device="cpu" if kind == "torch" else None)


def run_floating(session: Any, matrix: Matrix, combo: str) -> None:
    """``nox -s newest`` / ``nox -s main``: the combo's floating pins resolved now (newest releases; for ``main``
    those of the packages it does not build from source), then its cells. An index that cannot be read still gives
    one env-error record per cell asked for, at the last known pins: the combo's column does not vanish."""
    from fsdp_matrix.bisect.releases import newest_versions

    spec = matrix.combo(combo)
    opts, rest = parse(session.posargs)
    root = HERE / "results" / spec.session
    notify_report(session, root)
    floating = [p for p in spec.pins.model_dump() if p not in spec.sources]
    try:
        resolved = newest_versions(floating, pre=opts.pre, python=spec.python)
    except EnvError as exc:
        results = Path(opts.results or root) / spec.id
        pins = failed.last_known_pins(results, spec.pins.model_dump())
        message = f"cannot resolve the newest releases: {exc}"
        where = (results, opts.device or "cpu", int(opts.world_size or 2))
        env_error_records(session, matrix, spec, where, message, pins, rest)
        session.error(f"env-error for {spec.id}: {message.splitlines()[0]}")
    built = "; from source: " + ", ".join(f"{n} {v}" for n, v in spec.sources.items()) if spec.sources else ""
    session.log(f"{spec.id} resolves to " + ", ".join(f"{n} {v}" for n, v in resolved.items()) + built)
    run_combo(session, matrix, spec.with_pins(**resolved), root, device=opts.device or "cpu")


def notify_report(session: Any, root: Path) -> None:
    opts, _ = parse(session.posargs)
    session.notify("report", posargs=["--results", str(opts.results or root)])
