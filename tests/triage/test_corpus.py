"""The corpus's split into ``dev`` and ``test``: fixed before any tuning on it, by thread, and unchanged since.

Split version 2 (2026-11-28): version 1's test half was measured and reported once, so every version-1 paste
(tests/fixtures/triage/corpus/) is ``dev`` now; the held-out ``test`` half is pastes from threads the corpus never
used (tests/fixtures/triage/fresh/). A paste added, moved or edited later must be recorded in split.json on purpose,
which these tests make visible in review; a test paste edited after the split fails here by its sha256.
"""

import re
from pathlib import Path

from tests.triage.corpus import (
    CORPUS,
    FRESH,
    HALVES,
    SPLIT_RULE,
    SPLIT_VERSION,
    V1_RULE,
    load,
    recorded_split,
    split_record,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = load()
TEST = [fx for fx in FIXTURES if fx.half == "test"]
# a thread is named by its full URL (GitHub issue or pull request, or a forum topic)
URL = re.compile(r"https://(github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+|discuss\.pytorch\.org/t/[\w-]+/\d+)")


def test_the_split_is_the_recorded_one_and_no_test_paste_changed():
    recorded, now = recorded_split(), split_record(FIXTURES)
    assert (now["version"], now["rule"]) == (recorded["version"], recorded["rule"]) == (SPLIT_VERSION, SPLIT_RULE)
    assert now["dev"] == recorded["dev"]
    assert now["test"] == recorded["test"], "a test paste was added, removed or edited after the split was fixed"
    assert recorded["fixed"] == "2026-11-28" and recorded["why"]


def test_no_thread_is_on_both_sides():
    sides = {}
    for fx in FIXTURES:
        sides.setdefault(fx.thread, set()).add(fx.half)
    assert all(len(s) == 1 for s in sides.values()), [t for t, s in sides.items() if len(s) > 1]
    assert all(fx.half in HALVES for fx in FIXTURES)
    # the half is the folder, and no file name is in both folders
    assert [fx.name for fx in FIXTURES if fx.half == "dev"] == sorted(p.name for p in CORPUS.glob("*.txt"))
    assert [fx.name for fx in TEST] == sorted(p.name for p in FRESH.glob("*.txt"))
    assert len({fx.name for fx in FIXTURES}) == len(FIXTURES)


def test_version_1_is_kept_as_history_and_all_of_it_is_dev_now():
    (v1,) = recorded_split()["history"]
    assert (v1["version"], v1["rule"]) == (1, V1_RULE)
    dev = {fx.name: fx for fx in FIXTURES if fx.half == "dev"}
    assert sorted(v1["dev"] + list(v1["test"])) == sorted(dev)
    # version 1's halves are still what its rule gives, and its test pastes are unchanged since it was fixed
    assert all(dev[name].v1_half == "dev" for name in v1["dev"])
    assert {name: dev[name].sha256 for name in v1["test"]} == v1["test"]


def _cited_threads() -> set:
    """Every URL that matrix.yaml, the docs, the dev pastes and the other triage fixtures cite, as a thread."""
    texts = [
        ROOT / "matrix.yaml",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "tests" / "fixtures" / "triage").glob("*.txt"),
    ]
    found = re.findall(r"https?://[^\s)\]>\"'`]+", "".join(p.read_text() for p in texts + sorted(CORPUS.glob("*.txt"))))
    return {url.rstrip(".,;:").split("#", 1)[0].rstrip("/").lower() for url in found}


def test_the_test_half_is_real_pastes_from_threads_nothing_else_cites():
    cited = _cited_threads()
    for fx in TEST:
        assert URL.fullmatch(fx.url), fx.name
        assert fx.text.strip(), fx.name
        # no held-out thread is cited where a rule, a dev paste or a page could have been written from it
        assert fx.thread not in cited, fx.name


def test_the_corpus_has_the_size_the_issue_asks():
    covered = [fx for fx in FIXTURES if fx.expected]
    assert len(FIXTURES) >= 100 and len(covered) >= 40 and len(FIXTURES) - len(covered) >= 50
    assert {fx.half for fx in covered} == set(HALVES)
    # the held-out half alone: enough covered pastes for a recall figure and other pastes for a false-claim rate
    test_covered = [fx for fx in TEST if fx.expected]
    assert len(test_covered) >= 20 and len(TEST) - len(test_covered) >= 30
