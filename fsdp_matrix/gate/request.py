"""The gate's arguments: one source pin (the package under test and its head), the base, the cells, the outputs."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from fsdp_matrix.bisect.installers import parse_pins
from fsdp_matrix.bisect.wiring import StepOptions, add_step_arguments
from fsdp_matrix.envs.sources import SourcePin, is_source, parse_pin_arg, redact_url
from fsdp_matrix.errors import EnvError
from fsdp_matrix.git import git
from fsdp_matrix.usage import OneLineParser

PROG = "fsdp-matrix gate"


@dataclass(frozen=True)
class GateRequest:
    """A gate as asked for on the command line (``nox -s gate -- ...``)."""

    pin: SourcePin
    """The package under test and its repository; its ref is the head (``HEAD`` when none is given)."""
    base: Optional[str] = None
    """The ref whose merge base with the head is the base; None: the repository's default branch."""
    combos: List[str] = field(default_factory=list)
    """Combo ids whose other pins the cells run with; empty: the newest CPU combo."""
    cases: Optional[List[str]] = None
    """Case ids to run; None: every case."""
    holds: List[str] = field(default_factory=list)
    """``NAME==VERSION`` or ``NAME=SOURCE@REF`` pins of the other packages, the same at base and head."""
    json: Optional[Path] = None
    """Where the JSON answer goes."""
    summary: Optional[Path] = None
    """The markdown summary is appended here (``$GITHUB_STEP_SUMMARY``)."""
    allow_missing: int = 0
    """Cells that may go without a result at the base or the head before the gate fails for them."""
    bisect: bool = True
    """Bisect a changed cell over the pull request's commits (when it has several)."""
    step: StepOptions = StepOptions()
    """How each env is built and each launch runs: cache (base results are kept there by commit), matrix, device."""

    @property
    def head(self) -> str:
        """The head ref: the pin's ref, else ``HEAD``."""
        return self.pin.ref or "HEAD"


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def redacted(text: str) -> str:
    """``text`` with every URL in it as ``redact_url`` shows it (``https://***@host/x``): a pin is printed only so."""
    return _URL.sub(lambda m: redact_url(m.group()), text)


def _not_inside_a_repo(pin: SourcePin, text: str) -> None:
    """EnvError (one line) for a local path that is a folder inside a git repository, not its root."""
    path = Path(pin.repo)
    if pin.repo.startswith("file://") or not path.is_dir() or (path / ".git").exists() or (path / "HEAD").exists():
        return
    top = git(path, "rev-parse", "--show-toplevel", check=False)
    if top:
        raise EnvError(f"--pin {redacted(text)}: a folder inside the git repository {top}: give the repository's root")


def _check_holds(holds: Sequence[str]) -> None:
    """EnvError (one line) for a ``--hold`` that cannot be one, before anything is built."""
    for text in holds:
        if text[:1] in "'\"" or text[-1:] in "'\"":
            # the action's ``args`` input is split on spaces, not parsed by a shell: its quotes reach the gate
            raise EnvError(f"--hold {redacted(text)}: the quotes are part of the value (give it without quotes)")
    parse_pins([t for t in holds if "==" in t], what="--hold")


def _count(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more")
    return value


def _split(texts: Sequence[str]) -> List[str]:
    return [item.strip() for text in texts for item in text.split(",") if item.strip()]


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Run the cells at a package's head and at its merge base; list, confirm and bisect what changed.",
    )
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        required=True,
        metavar="NAME=PATH_OR_URL[@HEAD]",
        help="the package under test, built from its repository at HEAD (default: the checkout's HEAD)",
    )
    p.add_argument("--base", metavar="REF", help="the ref whose merge base with HEAD is the base (default branch)")
    p.add_argument("--combos", action="append", default=[], metavar="IDS", help="combo ids (default: newest cpu)")
    p.add_argument("--cases", action="append", default=[], metavar="IDS", help="case ids, comma-separated (all)")
    p.add_argument(
        "--hold",
        action="append",
        default=[],
        metavar="NAME==V|NAME=SOURCE@REF",
        help="hold another package at a release or a commit, at base and head alike",
    )
    p.add_argument(
        "--allow-missing",
        type=_count,
        default=0,
        metavar="N",
        help="pass with up to N cells that have no result at the base or the head (default 0: absence fails)",
    )
    p.add_argument("--no-bisect", dest="bisect", action="store_false", help="list the changes, bisect none")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the answer as JSON")
    p.add_argument("--summary", type=Path, metavar="PATH", help="append the markdown summary ($GITHUB_STEP_SUMMARY)")
    add_step_arguments(p, timeout=1800, world_size=2, cache_help="step envs and results, kept by commit")
    return p


def from_args(args: argparse.Namespace) -> GateRequest:
    """The request, or EnvError (one line) for a pin that is not one source of a package built from source."""
    if len(args.pin) != 1:
        shown = " ".join(redacted(p) for p in args.pin)
        raise EnvError(f"--pin: give exactly one package under test, got {len(args.pin)}: {shown}")
    text = args.pin[0]
    _, _, value = text.partition("=")
    if "==" in text or (value and not is_source(value) and " @ " not in text):
        raise EnvError(
            f"--pin {redacted(text)}: the gate builds the package from its repository: NAME=PATH_OR_URL[@HEAD]"
        )
    if args.base is not None and not args.base.strip():
        # an unset variable in a script: the default branch in its place would gate against another base unasked
        raise EnvError(f"--base {args.base!r}: names no ref: give a branch, tag or SHA, or leave --base out")
    if value.endswith("@") and " @ " not in text:
        # the action's head input left empty (an unset variable): the path exists, the ref is what is missing
        raise EnvError(f"--pin {redacted(text)}: the ref after @ is empty: give a branch, tag or SHA, or leave @ out")
    _, pin = parse_pin_arg(text)  # refuses torch and bitsandbytes from source, and a path that does not exist
    _not_inside_a_repo(pin, text)
    _check_holds(args.hold)
    return GateRequest(
        pin=pin,
        base=args.base,
        combos=_split(args.combos),
        cases=_split(args.cases) or None,
        holds=list(args.hold),
        json=args.json,
        summary=args.summary,
        allow_missing=args.allow_missing,
        bisect=args.bisect,
        step=StepOptions.from_args(args),
    )
