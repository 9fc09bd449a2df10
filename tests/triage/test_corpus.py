"""The corpus's split into ``dev`` and ``test``: fixed before any tuning on it, by thread, and unchanged since.

Split version 7 (2026-11-29): version 6's test half (tests/fixtures/triage/heldout6/) was measured and reported once,
so it is ``dev`` now with version 1's corpus/, version 2's fresh/ and versions 3's to 5's heldout3/ to heldout5/; the
held-out ``test`` half is tests/fixtures/triage/heldout7/, pastes from threads and pages nothing else in the repository
cites (a mirror, a proxy or a blog post of a GitHub thread is that thread).
A paste added, moved or edited later must be recorded in split.json on purpose, which these tests make visible in
review; a test paste edited after the split was fixed fails here by its sha256."""

import os
import re
from pathlib import Path

from tests.triage.corpus import (
    CORPUS,
    FRESH,
    HALVES,
    HELDOUT3,
    HELDOUT4,
    HELDOUT5,
    HELDOUT6,
    HELDOUT7,
    SPLIT_RULE,
    SPLIT_VERSION,
    V1_RULE,
    V2_RULE,
    V3_RULE,
    V4_RULE,
    V5_RULE,
    V6_RULE,
    load,
    recorded_split,
    split_record,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = load()
TEST = [fx for fx in FIXTURES if fx.half == "test"]
DEV = {fx.name: fx for fx in FIXTURES if fx.half == "dev"}
# a thread is named by its full URL (GitHub issue or pull request, or a forum topic); a page that copies one (a mirror,
# a proxy, a blog post) by the thread it copies
URL = re.compile(r"https://(github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+|discuss\.pytorch\.org/t/[\w-]+/\d+)")
# the held-out half as it was fixed: (covered, other) pastes; a change here is a change of the split, made on purpose
TEST_COUNTS = (15, 73)
# text files of the repository that could cite a thread (everything but the held-out pastes themselves)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".toml", ".cfg", ".ini", ".rst"}
SKIPPED_DIRS = {".git", ".nox", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules"}


def _names(folder: Path) -> list:
    return sorted(p.name for p in folder.glob("*.txt"))


def test_the_split_is_the_recorded_one_and_no_test_paste_changed():
    recorded, now = recorded_split(), split_record(FIXTURES)
    assert (now["version"], now["rule"]) == (recorded["version"], recorded["rule"]) == (SPLIT_VERSION, SPLIT_RULE)
    assert now["dev"] == recorded["dev"]
    assert now["test"] == recorded["test"], "a test paste was added, removed or edited after the split was fixed"
    assert recorded["fixed"] == "2026-11-29" and recorded["why"]


def test_no_thread_is_on_both_sides():
    sides = {}
    for fx in FIXTURES:
        sides.setdefault(fx.thread, set()).add(fx.half)
    assert all(len(s) == 1 for s in sides.values()), [t for t, s in sides.items() if len(s) > 1]
    assert all(fx.half in HALVES for fx in FIXTURES)
    # the half is the folder, and no file name is in two folders
    dev_folders = (CORPUS, FRESH, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6)
    assert sorted(DEV) == sorted(name for folder in dev_folders for name in _names(folder))
    assert {fx.folder for fx in DEV.values()} == {"corpus", "fresh", "heldout3", "heldout4", "heldout5", "heldout6"}
    assert [fx.name for fx in TEST] == _names(HELDOUT7) and {fx.folder for fx in TEST} == {"heldout7"}
    assert len({fx.name for fx in FIXTURES}) == len(FIXTURES)


def test_versions_6_to_1_are_kept_as_history_and_all_of_them_is_dev_now():
    v6, v5, v4, v3, v2, v1 = recorded_split()["history"]
    assert (v6["version"], v6["rule"], v6["retired"]) == (6, V6_RULE, True)
    # version 6: the five older folders were its dev half, heldout6/ its test half; none of it edited since
    assert sorted(v6["test"]) == _names(HELDOUT6) and sorted(v6["dev"] + list(v6["test"])) == sorted(DEV)
    assert {name: DEV[name].sha256 for name in v6["test"]} == v6["test"]
    assert (v5["version"], v5["rule"], v5["retired"]) == (5, V5_RULE, True)
    # version 5: the four older folders were its dev half, heldout5/ its test half; none of it edited since
    assert sorted(v5["test"]) == _names(HELDOUT5) and sorted(v5["dev"] + list(v5["test"])) == sorted(v6["dev"])
    assert {name: DEV[name].sha256 for name in v5["test"]} == v5["test"]
    assert (v4["version"], v4["rule"], v3["version"], v3["rule"]) == (4, V4_RULE, 3, V3_RULE)
    assert (v2["version"], v2["rule"], v1["version"], v1["rule"]) == (2, V2_RULE, 1, V1_RULE)
    assert v4["retired"] and v3["retired"] and v2["retired"] and v1["retired"]
    # version 4: corpus/, fresh/ and heldout3/ were its dev half, heldout4/ its test half; every paste of it is dev
    # now, none edited since it was measured
    assert v4["dev"] == sorted(_names(CORPUS) + _names(FRESH) + _names(HELDOUT3))
    assert sorted(v4["test"]) == _names(HELDOUT4) and sorted(v4["dev"] + list(v4["test"])) == sorted(v5["dev"])
    assert {name: DEV[name].sha256 for name in v4["test"]} == v4["test"]
    # version 3: corpus/ and fresh/ were its dev half, heldout3/ its test half; every paste of it is dev now, none
    # edited since it was measured
    assert v3["dev"] == sorted(_names(CORPUS) + _names(FRESH)) and sorted(v3["test"]) == _names(HELDOUT3)
    assert sorted(v3["dev"] + list(v3["test"])) == sorted(v4["dev"])
    assert {name: DEV[name].sha256 for name in v3["test"]} == v3["test"]
    # version 2: corpus/ was its dev half, fresh/ its test half
    assert v2["dev"] == _names(CORPUS) and sorted(v2["test"]) == _names(FRESH)
    assert {name: DEV[name].sha256 for name in v2["test"]} == v2["test"]
    # version 1: both its halves are corpus/, its halves are still what its rule gives, its test pastes unchanged
    assert sorted(v1["dev"] + list(v1["test"])) == _names(CORPUS)
    assert all(DEV[name].v1_half == "dev" for name in v1["dev"])
    assert {name: DEV[name].sha256 for name in v1["test"]} == v1["test"]


def _repo_text() -> str:
    """Every text file of the repository but the held-out pastes, lower-cased: where a thread could be cited."""
    texts = []
    for top, dirs, files in os.walk(ROOT):
        # prune environments and caches before walking into them
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and Path(top, d) != HELDOUT7)
        for name in sorted(files):
            if Path(name).suffix in TEXT_SUFFIXES:
                texts.append(Path(top, name).read_text(errors="replace"))
    return "\n".join(texts).lower()


def _cited_threads(text: str) -> set:
    """Every URL of the text, as a thread (no fragment, no trailing slash, no trailing punctuation)."""
    found = re.findall(r"https?://[^\s)\]>\"'`]+", text)
    return {url.rstrip(".,;:").split("#", 1)[0].rstrip("/") for url in found}


_SHORT_REF = re.compile(r"(?<![\w./-])([\w.-]+(?:/[\w.-]+)?#\d+)(?!\d)")
"""A thread named without its URL: ``owner/name#N`` or ``name#N`` (issue or PR), not inside a longer path."""


def _short_refs(fx) -> list:
    """How a text can name the paste's thread without its URL: ``owner/name#N`` or ``name#N``."""
    owner, name, _, number = fx.thread.split("/")[-4:] if "github.com" in fx.thread else ("", "", "", "")
    return [f"{owner}/{name}#{number}", f"{name}#{number}"] if number else []


def test_the_test_half_is_real_pastes_from_threads_nothing_else_cites():
    text = _repo_text()
    cited = _cited_threads(text)
    # every short reference in one pass: a search per paste over the whole repository took 18 s
    named = set(_SHORT_REF.findall(text))
    for fx in TEST:
        # a GitHub thread or a forum topic, or a page that copies a GitHub thread (then that thread), or a page of its
        # own (a forum, a blog post, a gist)
        assert URL.fullmatch(fx.original or fx.url) or re.fullmatch(r"https?://[^\s/]+\.[a-z]+/\S+", fx.url), fx.name
        assert fx.text.strip(), fx.name
        # no held-out thread is cited where a rule, a dev paste, a page or a test could have been written from it,
        # neither the page quoted nor the thread it copies
        assert fx.thread not in cited and fx.url.split("#", 1)[0].rstrip("/").lower() not in cited, fx.name
        assert not named.intersection(_short_refs(fx)), fx.name


def test_a_page_that_copies_a_thread_is_that_thread():
    """A blog post that retells a GitHub thread and the thread itself are one thread, on one side of the split (split
    version 7 has pastes from mirrors, proxies and blogs)."""
    copied = [fx for fx in FIXTURES if fx.original]
    assert copied and all(fx.thread == fx.original.lower() and URL.fullmatch(fx.original) for fx in copied)
    assert all(fx.folder == "heldout7" for fx in copied)
    assert all(not fx.original for fx in FIXTURES if fx.url.startswith("https://github.com/"))


def test_the_corpus_has_the_size_the_issue_asks():
    covered = [fx for fx in FIXTURES if fx.expected]
    assert len(FIXTURES) >= 100 and len(covered) >= 40 and len(FIXTURES) - len(covered) >= 50
    assert {fx.half for fx in covered} == set(HALVES)
    # the held-out half as fixed: its covered and other pastes, and more than one case among the covered ones
    test_covered = [fx for fx in TEST if fx.expected]
    assert (len(test_covered), len(TEST) - len(test_covered)) == TEST_COUNTS
    # version 7's: 8 cases (the search index returned few uncited threads of covered failures; versions 4 to 6 had
    # 11, 8 and 3)
    assert len({fx.expected for fx in test_covered}) >= 8


def test_a_dev_only_load_reads_no_file_of_the_held_out_half(monkeypatch):
    import tests.triage.corpus as corpus

    read = []
    monkeypatch.setattr(
        corpus, "_read", lambda path, half: read.append(path) or corpus.Fixture(path.name, "", None, "")
    )
    corpus.load(("dev",))
    assert read and not [p for p in read if HELDOUT7 in p.parents]


def test_the_table_counts_covered_pastes_named_at_all():
    from tests.triage.corpus import Fixture, Row, table

    rows = [
        Row(Fixture("a.txt", "u", "x", "t"), "y", "weak", 0.001, ("y", "x")),
        Row(Fixture("b.txt", "u", "x", "t"), None, None, 0.001, ()),
        Row(Fixture("c.txt", "u", None, "t"), None, None, 0.001, ()),
    ]
    text = table(rows)
    assert "| covered pastes named first (recall) | 0/2 |" in text
    assert "| covered pastes named at all (any claim of theirs) | 1/2 |" in text
    assert "| other pastes with any claim | 0/1 |" in text
