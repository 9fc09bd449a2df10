"""The corpus of real configs (tests/check/corpus): its split is the one recorded before tuning, each fixture names
its source, and ``check`` gives each the answer its fixture says, with no claim the fixture says is wrong."""

from __future__ import annotations

from collections import defaultdict

import pytest

from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import load_matrix
from tests.check import corpus

FIXTURES = corpus.fixtures()
OLD = load_matrix(None, check_repros=False).combo("old").pins.model_dump()
READERS = ("accelerate", "transformers", "peft", "trl")
old_readers = pytest.mark.skipif(
    any(installed_versions([p])[p] != OLD[p] for p in READERS),
    reason="the corpus's answers are those of the old combo's readers (nox -s 'tests(old)' runs them)",
)


def test_the_corpus_holds_at_least_25_configs_split_by_source_before_tuning():
    split = corpus.split()
    assert len(FIXTURES) >= 25 and {fx.name for fx in FIXTURES} == set(split)
    halves = defaultdict(set)
    for fx in FIXTURES:
        halves[split[fx.name]["half"]].add(fx.origin)
        assert split[fx.name]["origin"] == fx.origin
        assert split[fx.name]["inputs"] == corpus.digest(fx.folder, False), f"{fx.name}: its files changed"
        if split[fx.name]["half"] == "test":  # its expected answer was written before check first ran on it
            assert split[fx.name]["fixture"] == corpus.digest(fx.folder, True), f"{fx.name}: its answer changed"
    assert not halves["dev"] & halves["test"], "a source in both halves"
    assert min(sum(split[n]["half"] == h for n in split) for h in ("dev", "test")) >= 12


@pytest.mark.parametrize("fx", FIXTURES, ids=[fx.name for fx in FIXTURES])
def test_each_fixture_names_its_source_and_an_answer(fx):
    assert "github.com/" in fx.source
    assert fx.status in (0, 1, 2, 3) and fx.applies is not None


@old_readers
@pytest.mark.parametrize("fx", FIXTURES, ids=[fx.name for fx in FIXTURES])
def test_check_answers_each_config_as_its_fixture_says(fx):
    outcome = corpus.run(fx)
    assert not outcome.wrong_claims, f"claims the fixture says are wrong: {sorted(outcome.wrong_claims)}"
    assert (outcome.status, outcome.applies) == (fx.status, fx.applies), outcome.message
