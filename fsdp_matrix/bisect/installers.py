"""The Installers of a bisection: pinned uv envs per candidate release, or per day.

Each step gets its own venv under a cache dir, named by the hash of its requirements, so a repeated bisection (or
two dates that resolve alike) reuses it through ``envs.prepare``'s stamp instead of installing again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fsdp_matrix import envs
from fsdp_matrix.bisect.search import Prepared
from fsdp_matrix.clip import clip
from fsdp_matrix.envs.sources import Resolved
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import PACKAGES, Combo


@contextlib.contextmanager
def bytecode_on_import() -> Iterator[None]:
    """No ahead-of-time bytecode compile, but let the imports that do happen write their .pyc files.

    A step env runs one launch: compiling all of torch + transformers costs more than it saves. Without any .pyc,
    though, every process (the import check, then each rank) pays the slow import again. Letting the import check
    write bytecode for the modules it loads makes the ranks' imports fast, for a fraction of a full compile.
    """
    saved = {k: os.environ.get(k) for k in ("UV_COMPILE_BYTECODE", "PYTHONDONTWRITEBYTECODE")}
    os.environ["UV_COMPILE_BYTECODE"] = "0"
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def harness_root() -> Path:
    """The fsdp-matrix checkout to install (editable) into each step env, so the step runs this very workload."""
    # installers.py is fsdp_matrix/bisect/installers.py: the checkout is three levels up
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "pyproject.toml").is_file() and (root / "fsdp_matrix" / "bisect" / "__init__.py").is_file():
            return root
    raise EnvError("cannot find the fsdp-matrix checkout to install into step envs: run from the repo root")


def parse_pins(pins: Sequence[str], what: str = "--pin") -> Dict[str, str]:
    """``NAME==VERSION`` strings to a name -> version map; a name given twice (in any spelling) or a version that
    is not exact (``0.14.*``) is refused: the last one would otherwise win, or the install would float."""
    out: Dict[str, str] = {}
    for text in pins:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise EnvError(f"{what} {text!r}: expected NAME==VERSION, an exact version") from None
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise EnvError(f"{what} {text!r}: expected NAME==VERSION, an exact version")
        try:
            exact = "*" not in specs[0].version and Version(specs[0].version) is not None
        except InvalidVersion:
            exact = False
        if not exact:
            raise EnvError(f"{what} {text!r}: expected NAME==VERSION, an exact version such as {req.name}==1.2.3")
        name = canonicalize_name(req.name)
        if name in out:
            raise EnvError(f"{what} {text!r}: {name} given twice")
        out[name] = specs[0].version
    return out


def _runs(interpreter: Path) -> bool:
    try:
        return subprocess.run([str(interpreter), "-c", ""], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _create_venv(venv: Path, python: str) -> None:
    """Create ``venv`` unless it has an interpreter that runs. One that does not (a restored cache whose
    ``bin/python`` link points at a Python that moved: the env's name keys on the Python version, not on the
    interpreter's path) is recreated with ``--clear``, which takes its stamp with it, so the install runs again."""
    interpreter = venv / "bin" / "python"
    clear = []
    if interpreter.exists() or interpreter.is_symlink():
        if _runs(interpreter):
            return
        target = f" (a link to {os.readlink(interpreter)}, which is gone)" if not interpreter.exists() else ""
        print(f"env {venv.name}: its interpreter does not run{target}: recreating it and reinstalling", flush=True)
        clear = ["--clear"]
    cmd = ["uv", "venv", "--quiet", *clear, "--python", python, str(venv)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvError(f"uv venv {venv} failed: {clip(proc.stderr.strip(), 500, tail=True)}")


@dataclass
class InstallLog:
    """One env an installer was asked for."""

    pins: Dict[str, str]
    """The versions asked for."""
    ok: bool
    """Installed (or reused) and verified."""
    reused: bool
    """Its stamp was current: nothing was installed."""
    seconds: float
    """Wall time of creating, installing and verifying it."""


class PinnedInstaller:
    """Installs the combo's pins, overridden by ``--pin`` and then by the candidate, into a venv per pin set."""

    def __init__(
        self,
        combo: Combo,
        package: str,
        cache: Path,
        overrides: Mapping[str, str] = (),
        device: str = "cpu",
        python: Optional[str] = None,
    ) -> None:
        self.combo, self.package, self.cache, self.device = combo, canonicalize_name(package), cache, device
        self.overrides = dict(overrides or {})
        self.python = python or combo.python or sys.executable
        # the env's name holds the Python version, not this interpreter's path: nox's venv and a plain one share envs
        self.python_key = python or combo.python or f"{sys.version_info[0]}.{sys.version_info[1]}"
        self.harness = ["-e", str(harness_root())]
        self.log: List[InstallLog] = []
        """Every env asked for, in order: what an upgrade or bisect counts as its installs."""

    def pins_for(self, candidate: str) -> Dict[str, str]:
        pins = {**self.combo.pins.model_dump(), **self.overrides}
        pins[self.package] = candidate
        return pins

    def prepare(self, candidate: str) -> Prepared[Path]:
        return self.install(self.pins_for(candidate), list(self.combo.extra))

    def venv_for(self, pins: Mapping[str, str], extra: Sequence[str]) -> Path:
        key = envs.requirements_hash([f"{k}=={v}" for k, v in pins.items()] + list(extra) + [self.python_key])
        return self.cache / f"env-{key}"

    def install(
        self,
        pins: Mapping[str, str],
        extra: Sequence[str],
        sources: Optional[Mapping[str, Resolved]] = None,
        imports: Sequence[str] = envs.DEFAULT_IMPORTS,
    ) -> Prepared[Path]:
        """``sources``: packages built from a commit (bisect/commits.py); their pin is only a name for the env."""
        venv = self.venv_for(pins, extra)
        start = time.monotonic()
        changed = ", ".join(f"{k} {v}" for k, v in pins.items() if self.combo.pins.model_dump().get(k) != v)
        label = f"{self.combo.id}" + (f" + {changed}" if changed else "")
        try:
            _create_venv(venv, self.python)
            with bytecode_on_import():
                report = envs.prepare(
                    venv,
                    pins,
                    extra=extra,
                    harness=self.harness,
                    device=self.device,
                    allow_cuda_build=self.combo.allow_cuda_build,
                    label=label,
                    imports=imports,
                    sources=sources,
                )
        except (EnvError, OSError, subprocess.SubprocessError) as exc:
            report = envs.EnvReport(False, str(exc))
        self.log.append(InstallLog(dict(pins), report.ok, report.reused, time.monotonic() - start))
        return Prepared(venv) if report.ok else Prepared(None, report.message)


def _day(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise EnvError(f"--by-date {text!r}: expected a date YYYY-MM-DD ({exc})") from None


def days_between(old: str, new: str) -> List[str]:
    start, end = _day(old), _day(new)
    if start > end:
        raise EnvError(f"--by-date: {old} is after {new}")
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def _compiled(text: str) -> Dict[str, str]:
    pins: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.split("[", 1)[0])] = version.split(";", 1)[0].strip()
    return pins


class DatedInstaller:
    """A date's env: torch (and what it needs) pinned as in the combo, every other package as of that day.

    uv's ``--exclude-newer DAY`` keeps files uploaded up to the end of DAY. Files without an upload date (a
    find-links folder such as the local CPU torch wheel, a plain file:// mirror) are kept by uv, with a warning; a
    file that only a local mirror holds therefore passes every cutoff. Torch and its own dependency closure are
    resolved once with no cutoff, pinned exactly and exempted with ``--exclude-newer-package``: an early date
    would otherwise cut e.g. the setuptools that torch 2.13 requires and nothing would resolve.
    """

    def __init__(self, base: PinnedInstaller, floating: Sequence[str] = PACKAGES) -> None:
        self.base = base
        self.floating = [canonicalize_name(n) for n in floating if n != "torch" and n not in base.overrides]
        self.resolutions: Dict[str, Dict[str, str]] = {}
        self._torch: Optional[Dict[str, str]] = None

    def _compile(self, requirements: Sequence[str], args: Sequence[str]) -> Dict[str, str]:
        with tempfile.NamedTemporaryFile("w", suffix=".in", delete=False) as fh:
            fh.write("\n".join(requirements) + "\n")
        python = subprocess.run(
            [self.base.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        cmd = [
            "uv",
            "pip",
            "compile",
            "--quiet",
            "--no-header",
            "--no-annotate",
            "--python-version",
            python,
            *args,
            fh.name,
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **envs.uv_environment()}
        )
        os.unlink(fh.name)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "missing an upload date" not in ln]
            raise EnvError("cannot resolve: " + clip("\n".join(lines), lines=12, tail=True))
        return _compiled(proc.stdout)

    def torch_closure(self) -> Dict[str, str]:
        if self._torch is None:
            torch = self.base.overrides.get("torch", self.base.combo.pins.torch)
            self._torch = self._compile([f"torch=={torch}"], [])
        return self._torch

    def resolve(self, day: str) -> Dict[str, str]:
        """Exact versions of everything the env for ``day`` holds."""
        if day not in self.resolutions:
            closure = self.torch_closure()
            fixed = {**closure, **self.base.overrides}
            requirements = [f"{k}=={v}" for k, v in fixed.items()] + self.floating + list(self.base.combo.extra)
            # pinned exactly and resolved with no cutoff today, so tomorrow's cutoff lets each pinned file through
            tomorrow = (dt.date.today() + dt.timedelta(days=1)).isoformat()
            exempt = [a for name in fixed for a in ("--exclude-newer-package", f"{name}={tomorrow}")]
            self.resolutions[day] = self._compile(requirements, ["--exclude-newer", day, *exempt])
        return self.resolutions[day]

    def prepare(self, candidate: str) -> Prepared[Path]:
        try:
            resolved = self.resolve(candidate)
        except (EnvError, subprocess.SubprocessError) as exc:
            return Prepared(None, f"{candidate}: {exc}")
        top = {n: v for n, v in resolved.items() if n in PACKAGES or n in self.base.overrides}
        rest = [f"{n}=={v}" for n, v in resolved.items() if n not in top]
        return self.base.install(top, rest)

    def changes(self, old_day: str, new_day: str) -> List[str]:
        """``name old -> new`` for every package whose version differs between two resolved days."""
        a, b = self.resolutions.get(old_day, {}), self.resolutions.get(new_day, {})
        return [f"{n} {a.get(n, '-')} -> {b.get(n, '-')}" for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
