"""The pure search, driven by a fake installer and runner."""

from __future__ import annotations

import itertools
import random
from typing import Callable, Dict, List, Sequence, Set

import pytest

from fsdp_matrix.bisect.outcome import Outcome, normalise_message
from fsdp_matrix.bisect.search import (
    Prepared,
    SearchResult,
    Untestable,
    bisect_cells,
    install_bound,
)

OK = Outcome("ok")
BUG = Outcome.observed("error", "Exception", "Could not find the transformer layer class to wrap in the model.")


class FakeInstaller:
    def __init__(self, skip: Set[str] = frozenset()) -> None:
        self.skip = set(skip)
        self.calls: List[str] = []

    def prepare(self, candidate: str) -> Prepared[str]:
        self.calls.append(candidate)
        if candidate in self.skip:
            return Prepared(None, f"{candidate}: no wheel for this Python")
        return Prepared(f"env-{candidate}")


class FakeRunner:
    def __init__(self, outcome: Callable[[int], Outcome], candidates: List[str]) -> None:
        self.outcome, self.index = outcome, {c: i for i, c in enumerate(candidates)}
        self.runs: List[str] = []

    def run(self, env: str, candidate: str) -> Outcome:
        assert env == f"env-{candidate}", "the runner must get the env the installer prepared"
        self.runs.append(candidate)
        return self.outcome(self.index[candidate])

    def run_cells(self, env: str, candidate: str, cells: Sequence[str]) -> Dict[str, Outcome]:
        return {cell: self.run(env, candidate) for cell in cells}


class One:
    """The answer of a one-cell search, as ``bisect`` reads it."""

    def __init__(self, result: SearchResult) -> None:
        self.result, self.cell = result, result.cells["cell"]

    def __getattr__(self, name: str):
        return getattr(self.cell, name)

    @property
    def steps(self):
        return self.result.steps


def bisect(installer, runner, candidates, package, **kw) -> One:
    """One cell, worded as the release bisect words it."""
    return One(bisect_cells(installer, runner, candidates, ["cell"], package, tested="installed", **kw))


def versions(n: int) -> List[str]:
    return [f"0.{i}.0" for i in range(n)]


def flip_at(k: int, before: Outcome = BUG, after: Outcome = OK) -> Callable[[int], Outcome]:
    return lambda i: before if i < k else after


def run(n: int, outcome: Callable[[int], Outcome], skip: Set[str] = frozenset()) -> One:
    cands = versions(n)
    return bisect(FakeInstaller(skip), FakeRunner(outcome, cands), cands, "peft")


@pytest.mark.parametrize("before,after", [(BUG, OK), (OK, BUG)], ids=["fix-lands", "bug-appears"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 17, 40])
def test_finds_every_flip_point_in_both_directions(n: int, before: Outcome, after: Outcome) -> None:
    for k in range(1, n):
        result = run(n, flip_at(k, before, after))
        assert (result.first_changed, result.last_unchanged) == (f"0.{k}.0", f"0.{k - 1}.0")
        assert result.untestable == []
        assert len(result.steps) <= install_bound(n)
        assert result.answer.startswith(f"first changed: peft 0.{k}.0 (last unchanged: 0.{k - 1}.0)")


def test_flip_at_either_end() -> None:
    first = run(9, flip_at(1))
    assert (first.first_changed, first.last_unchanged) == ("0.1.0", "0.0.0")
    last = run(9, flip_at(8))
    assert (last.first_changed, last.last_unchanged) == ("0.8.0", "0.7.0")


def test_no_change_says_so_and_tests_only_the_ends() -> None:
    result = run(12, lambda i: BUG)
    assert result.first_changed is None and result.last_unchanged is None
    assert [s.candidate for s in result.steps] == ["0.0.0", "0.11.0"]
    assert result.answer.startswith("no change: peft 0.0.0 and 0.11.0 both give Exception")


def test_single_candidate() -> None:
    result = run(1, lambda i: OK)
    assert result.first_changed is None
    assert len(result.steps) == 1
    assert "nothing to compare" in result.answer


def test_all_skipped() -> None:
    result = run(5, lambda i: OK, skip=set(versions(5)))
    assert result.first_changed is None
    assert [s.installed for s in result.steps] == [False] * 5
    assert result.answer == "no candidate between peft 0.0.0 and 0.4.0 could be installed"


def test_skipped_middle_candidate_is_stepped_around() -> None:
    # 0.4.0 is the first median; it cannot be installed, so a neighbour is tested instead
    result = run(9, flip_at(6), skip={"0.4.0"})
    assert result.first_changed == "0.6.0" and result.last_unchanged == "0.5.0"
    skipped = [s for s in result.steps if not s.installed]
    assert [s.candidate for s in skipped] == ["0.4.0"] and "no wheel" in skipped[0].reason


def test_skip_next_to_the_change_leaves_it_ambiguous() -> None:
    result = run(9, flip_at(5), skip={"0.4.0"})
    assert (result.first_changed, result.last_unchanged) == ("0.5.0", "0.3.0")
    assert result.untestable == ["0.4.0"]
    assert "or one of the untestable 0.4.0" in result.answer


def test_uninstallable_ends_move_inwards() -> None:
    result = run(8, flip_at(4), skip={"0.0.0", "0.7.0"})
    assert (result.first_changed, result.last_unchanged) == ("0.4.0", "0.3.0")
    assert "0.0.0 could not be installed; reference is 0.1.0" in result.answer
    assert "0.7.0 could not be installed; newest tested is 0.6.0" in result.answer


def test_runner_that_cannot_run_the_cell_is_a_skip() -> None:
    cands = versions(7)

    class Flaky(FakeRunner):
        def run(self, env: str, candidate: str) -> Outcome:
            if candidate == "0.3.0":
                raise Untestable("no record: the launch died before the cell ran")
            return super().run(env, candidate)

    result = bisect(FakeInstaller(), Flaky(flip_at(5), cands), cands, "peft")
    assert (result.first_changed, result.last_unchanged) == ("0.5.0", "0.4.0")
    assert [s.reason for s in result.steps if not s.installed] == ["no record: the launch died before the cell ran"]


def test_only_one_installable() -> None:
    result = run(4, lambda i: OK, skip={"0.0.0", "0.1.0", "0.3.0"})
    assert result.first_changed is None
    assert result.answer.startswith("only peft 0.2.0 could be installed")


def test_a_third_outcome_counts_as_changed() -> None:
    other = Outcome.observed("error", "TypeError", "Could not find the transformer layer class to wrap in the model.")
    result = run(6, lambda i: BUG if i < 2 else (other if i < 4 else OK))
    assert result.first_changed == "0.2.0"


@pytest.mark.parametrize("seed", range(30))
def test_install_count_bound_holds_with_skips(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 60)
    k = rng.randint(1, n - 1)
    skip = {f"0.{i}.0" for i in rng.sample(range(1, n - 1), k=min(n - 2, rng.randint(0, 5)))} if n > 2 else set()
    result = run(n, flip_at(k), skip=skip)
    installed = [s for s in result.steps if s.installed]
    assert len(installed) <= install_bound(n)
    assert len(result.steps) == len(installed) + len([s for s in result.steps if not s.installed])
    # the true flip point lies in (last_unchanged, first_changed]
    idx = {c: i for i, c in enumerate(versions(n))}
    assert idx[result.last_unchanged] < k <= idx[result.first_changed]
    assert all(c in skip for c in result.untestable)


def test_bound_is_tight_enough() -> None:
    # exhaustive for small n: every flip point stays within ceil(log2 n) + 2 installs
    for n, k in itertools.chain.from_iterable(((n, k) for k in range(1, n)) for n in range(2, 70)):
        assert len(run(n, flip_at(k)).steps) <= install_bound(n), (n, k)


def test_steps_record_outcomes_and_seconds() -> None:
    ticks = iter(range(100))
    cands = versions(3)
    result = bisect(FakeInstaller(), FakeRunner(flip_at(1), cands), cands, "peft", clock=lambda: float(next(ticks)))
    assert [(s.candidate, s.outcome) for s in result.steps] == [("0.0.0", BUG), ("0.2.0", OK), ("0.1.0", OK)]
    assert all(s.seconds == 1.0 for s in result.steps)
    seen = []
    bisect(FakeInstaller(), FakeRunner(flip_at(1), cands), cands, "peft", on_step=seen.append)
    assert [s.candidate for s in seen] == ["0.0.0", "0.2.0", "0.1.0"]
    assert result.result.installs == 3


def test_by_date_answer_has_no_package_name() -> None:
    days = ["2025-01-01", "2025-01-02", "2025-01-03"]
    result = bisect(FakeInstaller(), FakeRunner(flip_at(2), days), days, "date")
    assert result.answer.startswith("first changed: 2025-01-03 (last unchanged: 2025-01-02)")


@pytest.mark.parametrize(
    "a,b",
    [
        ("Expected size [4, 16] but got [4, 32] at 0x7f3a2b1c", "Expected size [8, 16] but got [8, 32] at 0x55aa"),
        ("connect to 127.0.0.1:29500 failed (pid 1234)", "connect to 127.0.0.1:41877 failed (pid 98)"),
        (
            'File "/tmp/fsdp-bisect/v1/lib/python3.11/site-packages/peft/tuners/lora/dora.py", line 74',
            'File "/root/.cache/x/v2/lib/python3.11/site-packages/peft/tuners/lora/dora.py", line 80',
        ),
    ],
)
def test_normalise_strips_what_varies(a: str, b: str) -> None:
    assert normalise_message(a) == normalise_message(b)


def test_normalise_keeps_what_identifies_the_failure() -> None:
    bf16 = "Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32"
    fp16 = "Must flatten tensors with uniform dtype but got torch.float16 and torch.float32"
    assert normalise_message(bf16) == bf16
    assert normalise_message(bf16) != normalise_message(fp16)
    assert "peft/tuners/lora/dora.py" in normalise_message("at /x/y/site-packages/peft/tuners/lora/dora.py")


def test_outcome_equality_ignores_noise_but_not_type() -> None:
    a = Outcome.observed("error", "IndexError", "tuple index out of range at 0x1")
    assert a == Outcome.observed("error", "IndexError", "tuple index out of range at 0x2")
    assert a != Outcome.observed("error", "ValueError", "tuple index out of range at 0x1")
    assert Outcome.observed("hang", "X", "y") == Outcome("hang")


# ------------------------------------------------------------------------------------- several cells, one search


class FakeCellsRunner:
    """Cell name -> flip index; every call is one launch of the given cells."""

    def __init__(self, flips, candidates, cannot=()):
        self.flips, self.index, self.cannot = flips, {c: i for i, c in enumerate(candidates)}, set(cannot)
        self.launches: List[tuple] = []

    def run_cells(self, env, candidate, cells):
        self.launches.append((candidate, tuple(cells)))
        i = self.index[candidate]
        return {
            c: (Untestable("cell cannot run here") if (c, candidate) in self.cannot else flip_at(self.flips[c])(i))
            for c in cells
        }


def test_cells_with_the_same_flip_share_every_step() -> None:
    cands = versions(33)
    runner = FakeCellsRunner({"a": 20, "b": 20, "c": 20}, cands)
    result = bisect_cells(FakeInstaller(), runner, cands, ["a", "b", "c"], "peft")
    assert all((r.first_changed, r.last_unchanged) == ("0.20.0", "0.19.0") for r in result.cells.values())
    assert all(cells == ("a", "b", "c") for _, cells in runner.launches)
    single = bisect_cells(FakeInstaller(), FakeCellsRunner({"a": 20}, cands), cands, ["a"], "peft")
    assert result.installs == single.installs <= install_bound(33)


def test_cells_with_different_flips_each_find_theirs_and_each_candidate_installs_once() -> None:
    cands = versions(40)
    installer = FakeInstaller()
    flips = {"a": 3, "b": 17, "c": 18, "d": 39}
    result = bisect_cells(installer, FakeCellsRunner(flips, cands), cands, list(flips), "peft")
    for cell, k in flips.items():
        assert (result.cells[cell].first_changed, result.cells[cell].last_unchanged) == (f"0.{k}.0", f"0.{k - 1}.0")
    assert len(installer.calls) == len(set(installer.calls)) == result.installs


def test_known_ends_cost_no_step() -> None:
    cands = versions(2)
    known = {0: {"a": BUG, "b": BUG}, 1: {"a": OK, "b": BUG}}
    installer = FakeInstaller()
    result = bisect_cells(installer, FakeCellsRunner({}, cands), cands, ["a", "b"], "peft", known=known)
    assert installer.calls == [] and result.installs == 0
    assert result.cells["a"].first_changed == "0.1.0" and result.cells["b"].answer.startswith("no change")


def test_a_cell_that_cannot_run_at_a_candidate_skips_it_alone() -> None:
    cands = versions(9)
    runner = FakeCellsRunner({"a": 6, "b": 6}, cands, cannot={("a", "0.4.0")})
    result = bisect_cells(FakeInstaller(), runner, cands, ["a", "b"], "peft")
    assert result.cells["a"].first_changed == "0.6.0" and result.cells["b"].first_changed == "0.6.0"
    step = next(s for s in result.steps if s.candidate == "0.4.0")
    assert step.cells_skipped == {"a": "cell cannot run here"} and set(step.outcomes) == {"b"}


def test_comparison_can_be_by_verdict_only() -> None:
    cands = versions(5)
    x = Outcome.observed("error", "ValueError", "one", verdict="reproduced")
    y = Outcome.observed("error", "ValueError", "two", verdict="reproduced")
    z = Outcome.observed("ok", verdict="fix-holds")

    class Runner:
        def run_cells(self, env, candidate, cells):
            i = int(candidate.split(".")[1])
            return {"a": x if i < 2 else (y if i < 4 else z)}

    by_verdict = bisect_cells(FakeInstaller(), Runner(), cands, ["a"], "peft", same=lambda p, q: p.verdict == q.verdict)
    assert by_verdict.cells["a"].first_changed == "0.4.0"
    by_outcome = bisect_cells(FakeInstaller(), Runner(), cands, ["a"], "peft")
    assert by_outcome.cells["a"].first_changed == "0.2.0"  # the message changed there, the verdict did not
