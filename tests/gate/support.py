"""A toy package whose pull request breaks one cell and fixes another, and fakes of the gate's collaborators that
run its cells by calling the toy package as built at a commit (``git show``), with no env and no launch.

History (``make_pr_repo``), with what ``toypkg.behave()`` (a fix that must hold) and ``toypkg.quirk()`` (a reported
error) do:

    main:  m0 "Toy package (#1)"        behave -> 42; quirk raises RuntimeError("toy quirk")
           m1 "Docs on main (#5)"       (after the branch point: the merge base of pr and main is m0)
    pr:    p1 "Docs (#2)"
           p2 "Break behave (#3)"       behave raises ValueError("toy broke")
           p3 "Make quirk train (#4)"   quirk -> 1
           p4 "Mend behave (#6)"        behave -> 42 again (branch pr-mended)
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Sequence, Tuple

import yaml

from fsdp_matrix.bisect import commits
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.search import Prepared
from fsdp_matrix.cells import expand
from fsdp_matrix.gate.runs import AtCommit, Seen, seen
from fsdp_matrix.matrix import Combo, load_matrix
from fsdp_matrix.verdicts import Verdict
from tests.sources_support import PYPROJECT, commit, git

WORKS = "def behave():\n    return 42\n"
BROKEN = 'def behave():\n    raise ValueError("toy broke")\n'
QUIRK = 'def quirk():\n    raise RuntimeError("toy quirk")\n'
TRAINS = "def quirk():\n    return 1\n"
CASE = '''"""Toy case: calls the toy package the gate builds from source."""

import toypkg

CASE = "{case}"


def run(params, ctx):
    return {{"answer": toypkg.{call}()}}
'''
EXPECTED = {"toy-fix": None, "toy-quirk": ("RuntimeError", "toy quirk")}
"""Per case, the reported error it expects (None: it must train)."""


def make_pr_repo(repo: Path) -> Dict[str, str]:
    """Build the history above; returns name -> full SHA."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    base = {"pyproject.toml": PYPROJECT.format(version="0.2.0.dev0"), ".gitignore": "*.log\n"}
    shas = {"m0": commit(repo, "Toy package (#1)", {**base, "toypkg/__init__.py": WORKS + QUIRK, "README": "toy\n"})}
    git(repo, "tag", "v0.1.0")
    git(repo, "checkout", "-q", "-b", "pr")
    shas["p1"] = commit(repo, "Docs (#2)", {"README": "toy\ndocs\n"})
    shas["p2"] = commit(repo, "Break behave (#3)", {"toypkg/__init__.py": BROKEN + QUIRK})
    shas["p3"] = commit(repo, "Make quirk train (#4)", {"toypkg/__init__.py": BROKEN + TRAINS})
    git(repo, "checkout", "-q", "-b", "pr-mended")
    shas["p4"] = commit(repo, "Mend behave (#6)", {"toypkg/__init__.py": WORKS + TRAINS})
    git(repo, "checkout", "-q", "main")
    shas["m1"] = commit(repo, "Docs on main (#5)", {"README": "toy\nmain\n"})
    git(repo, "checkout", "-q", "pr")
    return shas


def write_toy_matrix(root: Path, pins: Dict[str, str], combos: Sequence[str] = ("toy",)) -> Path:
    """matrix.yaml of the combos ``combos`` (default one, ``toy``), each with ``pins``, and the two toy cases, with
    their repros, under ``root``."""
    cases = []
    for case, call in (("toy-fix", "behave"), ("toy-quirk", "quirk")):
        (root / f"{case.replace('-', '_')}.py").write_text(CASE.format(case=case, call=call))
        error = EXPECTED[case]
        expect = {"ok": True} if error is None else {"error": {"type": error[0], "match": error[1]}}
        cases.append({"id": case, "title": f"the toy's {call}", "report": "tests/gate/support.py",
                      "repro": f"{case.replace('-', '_')}.py", "grids": [{"toy": ["plain"]}],
                      "expect": [{**expect, "source": "the toy repo"}]})  # fmt: skip
    path = root / "matrix.yaml"
    listed = [{"id": c, "pins": pins, "tags": ["test"]} for c in combos]
    path.write_text(yaml.safe_dump({"combos": listed, "cases": cases}))
    return path


def toy_cells(matrix: Path) -> Dict[str, str]:
    """case -> its one cell key."""
    return {c.case: c.key for c in expand(load_matrix(matrix), "cpu", 2)}


def toy_outcome(repo: Path, sha: str, cell: str) -> Outcome:
    """What the cell does with the toy package as committed at ``sha``, judged as matrix.yaml's rule would."""
    space: Dict[str, object] = {}
    exec(git(repo, "show", f"{sha}:toypkg/__init__.py"), space)  # the toy's own two functions, nothing else
    case = cell.split("/", 1)[0]
    try:
        space["behave" if case == "toy-fix" else "quirk"]()  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - whatever the toy raises is the outcome
        expected = EXPECTED[case]
        hit = expected is not None and type(exc).__name__ == expected[0] and expected[1] in str(exc)
        verdict = Verdict.REPRODUCED if hit else (Verdict.REGRESSION if expected is None else Verdict.DIFFERENT_ERROR)
        return Outcome.observed("error", type(exc).__name__, str(exc), verdict.value)
    verdict = Verdict.FIX_HOLDS if EXPECTED[case] is None else Verdict.UNEXPECTED_FIX
    return Outcome.observed("ok", verdict=verdict.value)


class ToyRuns:
    """CellRuns without envs: each cell calls the toy package as committed; every run is counted."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.calls: list = []
        """(combo, commit, cells, fresh) of every run asked for."""

    def run(self, combo: Combo, sha: str, cells: Sequence[str], fresh: bool = False) -> AtCommit:
        self.calls.append((combo.id, sha, tuple(cells), fresh))
        return AtCommit(combo.id, sha, seen({c: toy_outcome(self.repo, sha, c) for c in cells}, cells, "no record"))


class _ToyInstaller:
    base = SimpleNamespace(log=[])

    def prepare(self, candidate: str) -> Prepared[str]:
        return Prepared(candidate)


class _ToyRunner:
    def __init__(self, repo: Path) -> None:
        self.repo, self.status = repo, None

    def run_cells(self, env: str, candidate: str, cells: Sequence[str]) -> Dict[str, Outcome]:
        return {c: toy_outcome(self.repo, env, c) for c in cells}


def toy_bisect(asked: list):
    """A Bisect that runs bisect/commits.py's own search, render and JSON over the request's real git line, with
    the toy's installer and runner in place of envs and launches; every request is appended to ``asked``."""

    def bisect(req: commits.CommitRequest) -> Tuple[int, dict]:
        asked.append(req)
        repo = Path(req.git)
        base, line = commits.first_parent_line(repo, req.good, req.bad)
        described = {c.sha: c for c in commits.describe(repo, line)}
        q = commits.Line(req, req.package, req.combo or "toy", list(req.cells), commits.rev(repo, req.good), base,
                         line, described, _ToyInstaller(), _ToyRunner(repo))  # fmt: skip
        start = time.monotonic()
        found = commits.search(q)
        return 0, commits.to_json(q, found, commits.render(q, found, start), start)

    return bisect


# ---------------------------------------------------------------- scripted outcomes: what each run of a cell gives

NO_RECORD = None
"""A scripted run that left no record (the launch was killed before the cell, or wrote nothing)."""
_STATUS = {"fix-holds": "ok", "UNEXPECTED-FIX": "ok", "hang": "hang", "crash": "crash", "skipped": "skipped"}


def scripted_seen(value) -> Seen:
    """A Seen from a scripted value: None (no record), a verdict, or (verdict, message) for an error that differs
    in its message only (a flake of the machine against the pull request's own failure)."""
    if value is None:
        return Seen(None, "no record for any cell: the backstop --timeout ran out")
    verdict, message = value if isinstance(value, tuple) else (value, value)
    status = _STATUS.get(verdict, "error")
    return Seen(Outcome.observed(status, "RuntimeError", message, verdict))


class Scripted:
    """CellRuns of scripted outcomes: ``script[(end, cell)]`` (end ``base`` or ``head``) lists what each run of the
    cell at that end gives, in order, the last one repeating; a cell without a script passes (fix-holds). Every run
    is counted in ``calls``; ``unbuilt`` names (combo, end) pairs that do not build."""

    def __init__(self, base: str, script: Dict[Tuple[str, str], list], unbuilt: Sequence[Tuple[str, str]] = ()):
        self.base, self.script, self.unbuilt = base, script, set(unbuilt)
        self.used: Dict[Tuple[str, str, str], int] = {}
        self.calls: list = []
        """(combo, end, cells, fresh) of every run asked for."""

    def next(self, combo: str, end: str, cell: str):
        values = self.script.get((end, cell), ["fix-holds"])
        n = self.used.get((combo, end, cell), 0)
        self.used[(combo, end, cell)] = n + 1
        return values[min(n, len(values) - 1)]

    def run(self, combo: Combo, sha: str, cells: Sequence[str], fresh: bool = False) -> AtCommit:
        end = "base" if sha == self.base else "head"
        self.calls.append((combo.id, end, tuple(cells), fresh))
        if (combo.id, end) in self.unbuilt:
            why = f"toypkg {sha[:10]} did not build or import: no module named setuptools"
            return AtCommit(combo.id, sha, {c: Seen(None, why) for c in cells}, built=False)
        return AtCommit(combo.id, sha, {c: scripted_seen(self.next(combo.id, end, c)) for c in cells})
