"""The corpus's split into ``dev`` and ``test``: fixed before any tuning, by thread, and unchanged since.

A paste added later lands in the half its thread's URL hashes to; the recorded split (tests/fixtures/triage/split.json)
must then be rewritten on purpose, which this test makes visible in review. A test paste edited after the split fails
here by its sha256.
"""

from tests.triage.corpus import HALVES, load, recorded_split, split_record

FIXTURES = load()


def test_the_split_is_the_recorded_one_and_no_test_paste_changed():
    recorded, now = recorded_split(), split_record(FIXTURES)
    assert now["rule"] == recorded["rule"]
    assert now["dev"] == recorded["dev"]
    assert now["test"] == recorded["test"], "a test paste was added, removed or edited after the split was fixed"


def test_no_thread_is_on_both_sides():
    sides = {}
    for fx in FIXTURES:
        sides.setdefault(fx.thread, set()).add(fx.half)
    assert all(len(s) == 1 for s in sides.values())
    assert all(fx.half in HALVES for fx in FIXTURES)


def test_the_corpus_has_the_size_the_issue_asks():
    covered = [fx for fx in FIXTURES if fx.expected]
    assert len(FIXTURES) >= 100 and len(covered) >= 40 and len(FIXTURES) - len(covered) >= 50
    assert {fx.half for fx in covered} == set(HALVES)
