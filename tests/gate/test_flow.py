"""The gate end to end through its command (``gate.cli.main``, what ``nox -s gate`` calls), over a toy package's
pull request (tests/gate/support.py), with the cells run by calling the toy package as committed and the real
commit bisect's search over the real git line: exit codes, the changed cells, the named commits, the markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.gate.changes import Confirmation
from fsdp_matrix.gate.cli import main
from fsdp_matrix.gate.runs import AtCommit, Seen
from fsdp_matrix.matrix import load_matrix
from tests.gate.support import ToyRuns, make_pr_repo, toy_bisect, toy_cells, write_toy_matrix


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gate")
    shas = make_pr_repo(root / "toypkg")
    matrix = write_toy_matrix(root, load_matrix().combo("old").pins.model_dump())
    return root, shas, matrix, toy_cells(matrix)


def gate(toy, tmp_path: Path, head: str, *extra: str, **collaborators):
    root, _, matrix, _ = toy
    asked: List = []
    runs = ToyRuns(root / "toypkg")
    out = tmp_path / "gate.json"
    summary = tmp_path / "summary.md"
    argv = ["--pin", f"toypkg={root / 'toypkg'}@{head}", "--combos", "toy", "--matrix", str(matrix)]
    argv += ["--cache", str(tmp_path / "cache"), "--json", str(out), "--summary", str(summary), *extra]
    collaborators.setdefault("runs", runs)
    code = main(argv, bisect=toy_bisect(asked), **collaborators)
    data = json.loads(out.read_text()) if out.exists() else None
    return code, data, summary.read_text() if summary.exists() else "", asked, runs


def test_a_pr_that_breaks_a_fix_fails_and_names_the_commit(toy, tmp_path) -> None:
    _, shas, _, cells = toy
    code, data, md, asked, runs = gate(toy, tmp_path, "pr")
    assert code == 1
    # the base is the merge base with main (m0), not main's tip (m1), and the head's cells ran there
    assert (data["base"], data["head"], data["base_ref"]) == (shas["m0"], shas["p3"], "main")
    assert data["commits"] == [shas["p1"], shas["p2"], shas["p3"]]
    # each end ran once from the cache's point of view, then the confirm step reran the changed cells in fresh
    # launches: twice at the head, then twice at the base (the sources moved between them)
    fresh = [(shas["p3"], True)] * 2 + [(shas["m0"], True)] * 2
    # (the head's run is fresh too: its records are never read back from the cache)
    assert [(c[1], c[3]) for c in runs.calls] == [(shas["m0"], False), (shas["p3"], True), *fresh]
    assert data["flaky"] == []
    changed = {c["cell"]: c for c in data["changed"]}
    assert set(changed) == {cells["toy-fix"], cells["toy-quirk"]}
    fix, quirk = changed[cells["toy-fix"]], changed[cells["toy-quirk"]]
    assert (fix["base"]["verdict"], fix["head"]["verdict"], fix["kind"], fix["fails"]) == (
        "fix-holds", "REGRESSION", "fix-broken", True)  # fmt: skip
    # it trains where the reported error was expected: listed, not a failure
    assert (quirk["base"]["verdict"], quirk["head"]["verdict"], quirk["kind"], quirk["fails"]) == (
        "reproduced", "UNEXPECTED-FIX", "now-trains", False)  # fmt: skip
    assert fix["commit"]["sha"] == shas["p2"] and fix["commit"]["pr"] == 3
    assert quirk["commit"]["sha"] == shas["p3"] and quirk["commit"]["pr"] == 4
    # one bisect for both cells (one combo, one world size), between the merge base and the head
    assert [(r.good, r.bad, sorted(r.cells)) for r in asked] == [(shas["m0"], shas["p3"], sorted(changed))]
    assert "**FAILED**" in md and "a fix stopped holding" in md
    assert f"| `toy` | `{cells['toy-fix']}` | fix-holds (ok) | REGRESSION (ValueError: toy broke) |" in md
    assert f"**{shas['p2'][:10]}** Break behave (#3) |" in md
    assert "the merge base with `main`; 3 commit(s) between" in md


def test_a_pr_that_only_fixes_a_reported_bug_passes_and_says_so(toy, tmp_path) -> None:
    _, shas, _, cells = toy
    code, data, md, _, _ = gate(toy, tmp_path, "pr-mended")
    assert code == 0
    assert [(c["cell"], c["kind"], c["commit"]["sha"]) for c in data["changed"]] == [
        (cells["toy-quirk"], "now-trains", shas["p3"])
    ]
    assert "**passed**" in md and "trains where a reported error was expected" in md


def test_an_unchanged_head_passes_and_bisects_nothing(toy, tmp_path) -> None:
    code, data, md, asked, _ = gate(toy, tmp_path, "pr~2")
    assert code == 0 and data["changed"] == [] and asked == []
    assert "**passed**" in md and "0 changed" in md


def test_a_one_commit_pr_names_its_commit_without_a_bisect(toy, tmp_path) -> None:
    _, shas, _, _ = toy
    code, data, md, asked, _ = gate(toy, tmp_path, "pr~1", "--base", "pr~2")
    assert code == 1 and asked == [] and data["commits"] == [shas["p2"]]
    assert f"One commit between base and head: {shas['p2'][:10]} 'Break behave (#3)' is the change." in md


def test_a_change_the_confirm_step_calls_flaky_neither_fails_nor_is_bisected(toy, tmp_path) -> None:
    _, _, _, cells = toy
    seen_by_confirm: List = []

    def confirm(changes, ctx):
        seen_by_confirm.append((sorted(c.cell for c in changes), ctx.base, ctx.head, sorted(ctx.combos)))
        flaky = [c for c in changes if c.cell == cells["toy-fix"]]
        return Confirmation([c for c in changes if c not in flaky], flaky, reruns=2)

    code, data, md, asked, _ = gate(toy, tmp_path, "pr", confirm=confirm)
    assert code == 0  # the broken fix did not repeat: no alert
    assert seen_by_confirm[0][0] == sorted(cells.values()) and seen_by_confirm[0][3] == ["toy"]
    assert [c["cell"] for c in data["flaky"]] == [cells["toy-fix"]] and data["reruns"] == 2
    assert asked[0].cells == [cells["toy-quirk"]]  # only the confirmed change is bisected
    assert "### Flaky (the head did not repeat, or the base reruns give it too: no alert, not bisected)" in md


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--pin", "toypkg==0.1.0"], "the gate builds the package from its repository"),
        (["--pin", "toypkg=/no/such/clone"], "no such path /no/such/clone"),
        (["--pin", "torch=/tmp"], "torch from source is refused"),
        (["--base", "no-such-ref"], "no commit named 'no-such-ref'"),
        (["--combos", "nope"], "no combo 'nope'"),
        (["--cases", "nope"], "nope"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_exits_2_in_one_line(toy, tmp_path, capsys, extra, line) -> None:
    root, _, matrix, _ = toy
    argv = ["--pin", f"toypkg={root / 'toypkg'}", "--matrix", str(matrix), "--combos", "toy"]
    argv += ["--cache", str(tmp_path / "cache")]
    if extra[0] == "--pin":
        argv = argv[2:]
    runs = ToyRuns(root / "toypkg")
    with pytest.raises(SystemExit) if extra == ["--bogus"] else _nothing() as raised:
        code = main(argv + extra, runs=runs)
    code = raised.value.code if extra == ["--bogus"] else code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and line in err[0], err
    assert runs.calls == []  # found before any cell ran


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _Unbuilt(ToyRuns):
    """The toy's runs, except that ``sha`` does not build."""

    def __init__(self, repo: Path, sha: str) -> None:
        super().__init__(repo)
        self.sha = sha

    def run(self, combo, sha, cells, fresh=False):
        if sha != self.sha:
            return super().run(combo, sha, cells, fresh)
        self.calls.append((combo.id, sha, tuple(cells), fresh))
        why = f"toypkg {sha[:10]} did not build or import: install failed\n  ╰─▶ no module named setuptools"
        return AtCommit(combo.id, sha, {c: Seen(None, why) for c in cells}, built=False)


def test_a_head_that_does_not_build_fails_and_a_base_that_does_not_cannot_be_judged(toy, tmp_path) -> None:
    root, shas, _, cells = toy
    code, data, md, _, _ = gate(
        toy, tmp_path / "head", "pr~2", "--no-bisect", runs=_Unbuilt(root / "toypkg", shas["p1"])
    )
    assert code == 1
    fix = next(c for c in data["changed"] if c["cell"] == cells["toy-fix"])
    assert (fix["head"]["verdict"], fix["kind"]) == ("env-error", "fix-broken")
    assert "env-error (no module named setuptools)" in md
    runs = _Unbuilt(root / "toypkg", shas["m0"])
    code, data, md, asked, _ = gate(toy, tmp_path / "base", "pr", runs=runs)
    assert code == 2 and asked == [] and data["changed"] == []
    assert [sha for _, sha, _, _ in runs.calls] == [shas["m0"]]  # nothing to compare the head against: not run
    assert data["problems"] == [f"toy: the base {shas['m0'][:10]} cannot be run: no module named setuptools"]
    assert "**cannot judge**" in md


class _FlakyOnce(ToyRuns):
    """The toy's runs, except that the first run of ``cell`` at ``sha`` fails once (a rank lost under load), and
    every later run of it does what the toy commit does."""

    def __init__(self, repo: Path, sha: str, cell: str) -> None:
        super().__init__(repo)
        self.sha, self.cell, self.failed = sha, cell, False

    def run(self, combo, sha, cells, fresh=False):
        got = super().run(combo, sha, cells, fresh)
        if sha == self.sha and self.cell in got.cells and not self.failed:
            self.failed = True
            # a rank the OOM killer took: a crash record (no record at all would leave the cell not judged)
            got.cells[self.cell] = Seen(Outcome.observed("crash", verdict="crash"))
        return got


def test_the_default_confirm_step_reruns_changes_and_a_head_that_fails_once_made_the_cell_flaky(toy, tmp_path) -> None:
    """Real confirm step (fsdp_matrix.confirm through gate/confirming.py), fake cells: the head p2 breaks toy-fix for
    good, and its first run of toy-quirk crashes once (a rank lost), its reruns reproducing as the base does. Both
    fail the gate: toy-fix as a fix that stopped holding, bisected; toy-quirk as made flaky (it fails in a head run
    and in no base run: a pull request must not make a cell flaky), not bisected (a search needs a repeating
    answer). Before the review of 2026-11-28 toy-quirk was listed as flaky and passed."""
    root, shas, _, cells = toy
    runs = _FlakyOnce(root / "toypkg", shas["p2"], cells["toy-quirk"])
    code, data, md, asked, _ = gate(toy, tmp_path, "pr~1", "--base", "pr~3", runs=runs)
    assert code == 1 and data["flaky"] == []
    kinds = {c["cell"]: (c["kind"], c["fails"]) for c in data["changed"]}
    assert kinds == {cells["toy-fix"]: ("fix-broken", True), cells["toy-quirk"]: ("made-flaky", True)}
    assert asked and all(cells["toy-quirk"] not in a.cells for a in asked)  # nothing bisected for the flaky cell
    assert [c for c in runs.calls if c[3]] and data["reruns"] == 8  # 2 cells x (2 at head + 2 at base)
    assert "made flaky" in md
