"""A corpus of real FSDP configs and the answer ``check`` must give each, reviewed by hand.

Each fixture is a folder: the files ``check`` reads (``accelerate.yaml``, ``training_args.yaml``,
``adapter_config.json``, ``bnb.json``; verbatim from the source, or translated where the source is another
format, as ``fixture.yaml`` says), and ``fixture.yaml`` with the source URL, the versions answered for (a combo
whose pins are the user's versions) and the expected answer: the exit status and the cases that apply.

The corpus is split by source into two halves (``split.json``, written before any tuning, with a digest of each
fixture's inputs, and of the test half's expected answers too): the mapping was tuned on the dev half only, and the
test half's answers were written before ``check`` was first run on it. ``python -m tests.check.corpus`` prints both
halves' figures. Every file is read with the libraries installed here (the old combo's in ``nox -s tests``), so the
answers do not depend on which envs are built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple
from unittest import mock

import yaml

CORPUS = Path(__file__).resolve().parent
SPLIT = CORPUS / "split.json"
FILES = {"accelerate.yaml": "accelerate_config", "training_args.yaml": "training_args",
         "adapter_config.json": "peft", "bnb.json": "bnb"}  # fmt: skip
"""Fixture file -> the ``check`` option that reads it."""


@dataclass
class Fixture:
    """One config of the corpus."""

    name: str
    folder: Path
    source: str
    origin: str
    versions: str
    sets: List[str]
    status: Optional[int]
    applies: Optional[Set[str]]


@dataclass
class Outcome:
    """What ``check`` answered for one fixture."""

    fixture: Fixture
    status: int
    applies: Set[str] = field(default_factory=set)
    message: str = ""

    @property
    def right(self) -> bool:
        return self.status == self.fixture.status and self.applies == (self.fixture.applies or set())

    @property
    def wrong_claims(self) -> Set[str]:
        """Cases claimed that the fixture says do not apply."""
        return self.applies - (self.fixture.applies or set())


def fixtures() -> List[Fixture]:
    out = []
    for folder in sorted(p for p in CORPUS.iterdir() if (p / "fixture.yaml").exists()):
        data = yaml.safe_load((folder / "fixture.yaml").read_text())
        expect = data.get("expect") or {}
        applies = expect.get("applies")
        out.append(
            Fixture(folder.name, folder, data["source"], data["origin"], data["versions"], data.get("set", []),
                    expect.get("status"), None if applies is None else set(applies))
        )  # fmt: skip
    return out


def digest(folder: Path, with_expect: bool) -> str:
    """sha256 over the fixture's input files (and fixture.yaml when ``with_expect``), by name."""
    h = hashlib.sha256()
    names = sorted(n for n in FILES if (folder / n).exists()) + (["fixture.yaml"] if with_expect else [])
    for name in names:
        h.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return h.hexdigest()


def split() -> Dict[str, Dict[str, str]]:
    return json.loads(SPLIT.read_text())


def argv_for(fx: Fixture) -> List[str]:
    from fsdp_matrix.matrix import load_matrix

    pins = load_matrix(None, check_repros=False).combo(fx.versions).pins.model_dump()
    argv = ["--versions", ",".join(f"{k}={v}" for k, v in pins.items() if v)]
    for name, dest in FILES.items():
        if (fx.folder / name).exists():
            argv += ["--" + dest.replace("_", "-"), str(fx.folder / name)]
    for item in fx.sets:
        argv += ["--set", item]
    return argv


def run(fx: Fixture) -> Outcome:
    """``check`` on one fixture, reading with the libraries installed here."""
    from fsdp_matrix.check import cli, where
    from fsdp_matrix.errors import MatrixError

    args = cli.parser().parse_args(argv_for(fx))
    with mock.patch.object(where, "combo_env", lambda matrix, wanted: None), redirect_stdout(StringIO()):
        try:
            answer, _, _ = cli.answer(args)
        except MatrixError as exc:
            return Outcome(fx, 2, set(), str(exc))
    applies = {c.case for c in answer.cases if c.status == "applies"}
    return Outcome(fx, answer.exit_status, applies, answer.out_of_scope or "")


def figures(outcomes: List[Outcome]) -> Tuple[int, int, int, int, int]:
    """(configs answered right, configs, claims made, claims right, claims expected)."""
    made = sum(len(o.applies) for o in outcomes)
    right_claims = sum(len(o.applies & (o.fixture.applies or set())) for o in outcomes)
    expected = sum(len(o.fixture.applies or ()) for o in outcomes)
    return sum(o.right for o in outcomes), len(outcomes), made, right_claims, expected


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.check.corpus", description="The corpus's figures per half.")
    p.add_argument("--half", choices=("dev", "test", "both"), default="both")
    args = p.parse_args(argv)
    halves = split()
    total_wrong = 0
    for half in ("dev", "test") if args.half == "both" else (args.half,):
        mine = [fx for fx in fixtures() if halves[fx.name]["half"] == half]
        outcomes = []
        for n, fx in enumerate(mine, 1):
            outcomes.append(run(fx))
            o = outcomes[-1]
            mark = "ok " if o.right else "BAD"
            said = f"exit {o.status} (expected {fx.status}), applies {sorted(o.applies)}"
            print(
                f"[{half} {n}/{len(mine)}] {mark} {fx.name}: {said} (expected {sorted(fx.applies or [])})", flush=True
            )
            total_wrong += len(o.wrong_claims)
        right, n_configs, made, right_claims, expected = figures(outcomes)
        print(f"{half}: {right}/{n_configs} configs answered as their fixture says; claims: {made} made, "
              f"{right_claims} right, {expected} expected; wrong claims: {made - right_claims}")  # fmt: skip
    return 1 if total_wrong else 0
