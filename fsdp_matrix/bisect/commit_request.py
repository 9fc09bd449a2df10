"""A commit bisect as asked for (``bisect --git`` or the nightly) and what it needs to run: the request, its checks,
the line of first-parent commits (fsdp_matrix.git) and the installer that builds one commit over a combo's pins.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name

from fsdp_matrix import options
from fsdp_matrix.bisect.installers import PinnedInstaller, parse_pins
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import Prepared
from fsdp_matrix.bisect.wiring import StepOptions, add_step_arguments, bisection_from
from fsdp_matrix.cells import find_cell
from fsdp_matrix.envs import DEFAULT_IMPORTS
from fsdp_matrix.envs.sources import (
    REFUSED,
    Resolved,
    SourcePin,
    parse_source,
    redact_url,
    repository,
    resolve,
    resolve_pins,
)
from fsdp_matrix.errors import EnvError
from fsdp_matrix.git import Commit, describe, first_parent_line, is_ancestor, is_repository, rev
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.paths import usable_dir, writable_file
from fsdp_matrix.usage import OneLineParser

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
"""A distribution name (PEP 508)."""


def import_name(package: str) -> str:
    """The module a package is imported as (``peft`` -> ``peft``); a dash becomes an underscore."""
    return canonicalize_name(package).replace("-", "_")


class CommitInstaller:
    """An Installer whose candidates are commits of one package's repository, over a combo's other pins."""

    def __init__(
        self,
        base: PinnedInstaller,
        pin: SourcePin,
        source_cache: Path,
        context: Optional[Mapping[str, str]] = None,
        held: Optional[Mapping[str, Resolved]] = None,
    ) -> None:
        self.base, self.pin, self.source_cache = base, pin, source_cache
        self.context = dict(context) if context is not None else None
        """The other packages' pins (an upgrade holds them at its base or target); None: the combo's, with --pin."""
        self.held = dict(held or {})
        """Other packages built from source at one commit for every step (the nightly's main combo holds the
        packages it does not bisect at tonight's commits)."""
        self.imports = tuple(dict.fromkeys([*DEFAULT_IMPORTS, import_name(pin.package)]))

    def prepare(self, candidate: str) -> Prepared[Path]:
        try:
            src = resolve(SourcePin(self.pin.package, self.pin.repo, candidate), self.source_cache)
        except EnvError as exc:
            return Prepared(None, str(exc))
        # the pin's value only names the env (one per commit); the source build replaces it
        held = (
            self.context if self.context is not None else {**self.base.combo.pins.model_dump(), **self.base.overrides}
        )
        # the whole key of a held source: a working tree edited between runs names another env (and results)
        pins = {
            **held,
            **{n: f"git-{s.commit[:20]}" + (f"+{s.dirty}" if s.dirty else "") for n, s in self.held.items()},
        }
        pins[self.pin.package] = f"git-{src.commit[:12]}"
        extra = list(self.base.combo.extra)
        sources = {**self.held, self.pin.package: src}
        return self.base.install(pins, extra, sources=sources, imports=self.imports)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="fsdp-matrix bisect --git",
        description="Find the first commit of a package whose build changes a cell's observed outcome.",
    )
    p.add_argument(
        "cells",
        nargs="+",
        metavar="CELL",
        help="CASE/CELL (or a cell id unique across cases); several cells share every step",
    )
    p.add_argument("--package", required=True, help="package built from the repository, e.g. peft")
    p.add_argument("--git", required=True, metavar="REPO", help="local clone (path) or git URL of the package")
    p.add_argument("--good", required=True, metavar="REF", help="ref whose outcome is the reference, e.g. v0.13.2")
    p.add_argument("--bad", required=True, metavar="REF", help="ref whose outcome differs, e.g. v0.14.0")
    options.add_arguments(p.add_argument, ("combo",), model=options.MatrixOptions)  # declared once
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="NAME==VERSION|NAME=SOURCE",
        help="override a combo pin with a release, or with a source held at one commit (NAME=PATH_OR_URL@REF)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the result as JSON")
    # the step options, declared once (bisect/wiring.py); the world size defaults to the cell id's
    add_step_arguments(p, timeout=900)
    return p


@dataclass(frozen=True)
class CommitRequest:
    """A commit bisect as asked for: by ``bisect --git`` on the command line, or by the nightly."""

    cells: List[str]
    """Cell refs (CASE/CELL, or an id unique across cases); several share every step."""
    package: str
    """The package built from the repository."""
    git: str
    """Its repository: a local clone or a git URL."""
    good: str
    """The ref whose outcome is the reference."""
    bad: str
    """The ref whose outcome differs."""
    combo: Optional[str] = None
    """The combo giving the other pins (default: the newest CPU combo)."""
    pins: List[str] = field(default_factory=list)
    """``NAME==VERSION`` or ``NAME=SOURCE`` overrides of the combo's pins."""
    json: Optional[Path] = None
    """Where to write the JSON answer."""
    step: StepOptions = StepOptions()
    """How each step runs."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CommitRequest:
        return cls(
            args.cells, args.package, args.git, args.good, args.bad, args.combo, list(args.pin), args.json,
            StepOptions.from_args(args),
        )  # fmt: skip


@dataclass
class Line:
    """The commits to search, and what runs them: what ``load`` finds."""

    request: CommitRequest
    package: str
    """The canonical package name."""
    combo: str
    """The combo's id."""
    cells: List[str]
    """Cell keys."""
    good: str
    """GOOD's full SHA."""
    merge_base: str
    """The merge base of GOOD and BAD: the line's first commit."""
    line: List[str]
    """The first-parent commits from the merge base to BAD, oldest first."""
    commits: Dict[str, Commit]
    """SHA -> subject, date and PR, for GOOD and the line."""
    installer: CommitInstaller
    """Installs a commit's build over the combo's pins."""
    runner: LaunchRunner
    """Runs a step's cells on one launch."""

    @property
    def off_line(self) -> bool:
        return self.good != self.merge_base


def load(req: CommitRequest) -> Line:
    """The repository, the line of commits, the cells and the wiring; EnvError (one line) for a bad argument."""
    package = canonicalize_name(req.package)
    if package in REFUSED:
        raise EnvError(f"--package {package}: building {package} from source is refused ({REFUSED[package]})")
    if not _NAME.match(req.package):
        raise EnvError(f"--package {req.package!r}: not a package name")
    cache = usable_dir(req.step.cache)
    if req.json:
        writable_file(req.json)
    releases, held = _held_pins(req.pins, cache)
    if package in held or package in releases:
        raise EnvError(f"--pin {package}: {package} is the package being bisected (--good .. --bad)")
    pin = parse_source(package, req.git)
    repo = repository(pin, cache / "sources")
    if not is_repository(repo):
        raise EnvError(f"--git {redact_url(req.git)}: not a git repository")
    good, bad = rev(repo, req.good), rev(repo, req.bad)
    if good == bad:
        raise EnvError(f"--good {req.good} and --bad {req.bad} are the same commit ({good[:10]}): nothing to bisect")
    if is_ancestor(repo, bad, good):
        raise EnvError(f"--good {req.good} comes after --bad {req.bad}: swap them")
    matrix = load_matrix(req.step.matrix)
    combo = matrix.combo(req.combo) if req.combo else matrix.newest("cpu")
    found = [find_cell(matrix, ref, req.step.device, req.step.world_size) for ref in req.cells]
    cells = [c.key for c in found]
    sizes = {c.world_size for c in found}
    if len(sizes) > 1:
        raise EnvError(f"cells {', '.join(cells)}: one launch per step needs one world size, got {sorted(sizes)}")
    merge_base, line = first_parent_line(repo, req.good, req.bad)
    commits = {c.sha: c for c in describe(repo, list(dict.fromkeys([good, *line])))}
    wired = bisection_from(
        req.step, combo, package=package, pins=releases, world_size=sizes.pop(), say=lambda text: None,
        label=lambda sha: f"{package} {sha[:10]}",
    )  # fmt: skip
    installer = CommitInstaller(wired.installer, pin, cache / "sources", held=held)
    return Line(req, package, combo.id, cells, good, merge_base, line, commits, installer, wired.runner)


def _held_pins(pins: Sequence[str], cache: Path) -> Tuple[Dict[str, str], Dict[str, Resolved]]:
    """``--pin``'s releases and sources held at one commit; a package pinned twice (two sources, or a release and a
    source) is refused, as the last would otherwise win without a word."""
    releases = parse_pins([t for t in pins if "==" in t])
    held = resolve_pins([t for t in pins if "==" not in t], cache / "sources")
    for name in sorted(set(releases) & set(held)):
        raise EnvError(f"--pin {name}: {name} pinned twice (a release and a source); give one")
    return releases, held
