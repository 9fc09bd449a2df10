"""The triage corpus: real pastes from upstream threads, each with its URL and the case it should be named as first,
or ``none`` for another failure; and the measure of triage on it.

``python -m tests.triage.corpus [--matrix FILE] [--half dev|test|all]`` prints the table for each half: precision
(claims that were right), recall (covered pastes named first), covered pastes named at all (among the claims), claims
on other pastes, strong claims that were wrong, median time per paste. ``--half dev`` reads no file of the test half.
``--half dev --formats`` measures the dev pastes in each format of ``tests/triage/formats.py`` (wrapped, rich, log
prefixes, a web page's entities and quotes).

The corpus is split by thread into ``dev`` (the half triage is tuned on) and ``test`` (held out, measured once at the
end), recorded in ``tests/fixtures/triage/split.json`` with the sha256 of each test paste
(tests/triage/test_corpus.py checks it). Split version 7 (2026-11-29): ``dev`` is every paste of
``tests/fixtures/triage/corpus/``, ``fresh/`` and ``heldout3/`` to ``heldout6/`` (versions 3's to 6's test halves were
each measured and reported once, so they are no longer held out), ``test`` is every paste of
``tests/fixtures/triage/heldout7/`` (pastes from threads and pages nothing else in the repository cites, collected
after version 6's measurement; triage was not run on them before the split was fixed; measured once at 749660e on
2026-11-29, and tuned on since, so spent: the next held-out half needs new pastes and split version 8). A paste
quoted from a mirror, a proxy or a blog that retells a GitHub thread belongs to that thread (``Fixture.thread``). No
thread has pastes in both halves. Versions 6 to 3 (``heldout6/`` to ``heldout3/`` the test halves), 2 (the half was
the folder: ``corpus/`` dev, ``fresh/`` test) and 1 (the parity of the sha256 of the thread's URL) are kept in
split.json as history; ``Fixture.v1_half`` recomputes version 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage.match import claims, match
from fsdp_matrix.triage.parse import parse
from tests.triage.formats import FORMATS

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "triage" / "corpus"
FRESH = ROOT / "tests" / "fixtures" / "triage" / "fresh"
HELDOUT3 = ROOT / "tests" / "fixtures" / "triage" / "heldout3"
HELDOUT4 = ROOT / "tests" / "fixtures" / "triage" / "heldout4"
HELDOUT5 = ROOT / "tests" / "fixtures" / "triage" / "heldout5"
HELDOUT6 = ROOT / "tests" / "fixtures" / "triage" / "heldout6"
HELDOUT7 = ROOT / "tests" / "fixtures" / "triage" / "heldout7"
SPLIT = ROOT / "tests" / "fixtures" / "triage" / "split.json"
HALVES = ("dev", "test")
# split version 7: the half is the folder. corpus/ (version 1, both halves), fresh/ (version 2's test half),
# heldout3/ to heldout6/ (versions 3's to 6's test halves), each measured and reported once, are dev; heldout7/ is the
# held-out test half, collected after version 6's measurement
FOLDERS = {"dev": (CORPUS, FRESH, HELDOUT3, HELDOUT4, HELDOUT5, HELDOUT6), "test": (HELDOUT7,)}
SPLIT_VERSION = 7
SPLIT_RULE = (
    "half = the folder: dev = tests/fixtures/triage/corpus/, tests/fixtures/triage/fresh/, "
    "tests/fixtures/triage/heldout3/, tests/fixtures/triage/heldout4/, tests/fixtures/triage/heldout5/ and "
    "tests/fixtures/triage/heldout6/, test = tests/fixtures/triage/heldout7/"
)
V6_RULE = (
    "half = the folder: dev = tests/fixtures/triage/corpus/, tests/fixtures/triage/fresh/, "
    "tests/fixtures/triage/heldout3/, tests/fixtures/triage/heldout4/ and tests/fixtures/triage/heldout5/, "
    "test = tests/fixtures/triage/heldout6/"
)
# where a paste's source line names the GitHub thread its page copies: a mirror or proxy of the thread, a blog post
# that retells it, a diff viewer's copy of a pull request's commit
ORIGINAL = re.compile(
    r"(?:mirror of|proxy of|retelling|retells|commit of) (https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+)"
)
V5_RULE = (
    "half = the folder: dev = tests/fixtures/triage/corpus/, tests/fixtures/triage/fresh/, "
    "tests/fixtures/triage/heldout3/ and tests/fixtures/triage/heldout4/, test = tests/fixtures/triage/heldout5/"
)
V4_RULE = (
    "half = the folder: dev = tests/fixtures/triage/corpus/, tests/fixtures/triage/fresh/ and "
    "tests/fixtures/triage/heldout3/, test = tests/fixtures/triage/heldout4/"
)
V3_RULE = (
    "half = the folder: dev = tests/fixtures/triage/corpus/ and tests/fixtures/triage/fresh/, "
    "test = tests/fixtures/triage/heldout3/"
)
V2_RULE = "half = the folder: dev = tests/fixtures/triage/corpus/, test = tests/fixtures/triage/fresh/"
V1_RULE = "half = ('dev', 'test')[int(sha256(thread_url.lower()).hexdigest()[:8], 16) % 2]"


@dataclass(frozen=True)
class Fixture:
    """One pasted failure of the corpus."""

    name: str
    """The file name."""
    url: str
    """The upstream thread it is quoted from."""
    expected: Optional[str]
    """The case it should be named as first; None for a failure the matrix does not cover."""
    text: str
    """What the user pasted (the file without its two header lines)."""
    sha256: str = ""
    """The sha256 of the whole file (header lines included), as the split records it."""
    half: str = "dev"
    """``dev`` or ``test``: the half its folder is in (split version 7)."""
    folder: str = "corpus"
    """The folder the paste is in: ``corpus``, ``fresh`` or ``heldout3`` to ``heldout7``."""
    original: str = ""
    """The GitHub thread that the page at ``url`` copies or retells (a mirror, a proxy, a blog post), as its source
    line names it; empty for a page that is its own thread."""

    @property
    def thread(self) -> str:
        """The thread the paste is quoted from: the thread its page copies, else its URL; without a fragment or a
        trailing slash, lower-cased. Two copies of one thread are one thread, on one side of the split."""
        return (self.original or self.url).split("#", 1)[0].rstrip("/").lower()

    @property
    def v1_half(self) -> str:
        """The half split version 1 gave the paste (history): the parity of its thread URL's sha256."""
        return HALVES[int(hashlib.sha256(self.thread.encode()).hexdigest()[:8], 16) % 2]


def _read(path: Path, half: str) -> Fixture:
    """One fixture file: the URL on its first line, the expected case on its second, the paste after them."""
    raw = path.read_bytes()
    lines = raw.decode("utf-8").splitlines()
    url = lines[0].split("source:", 1)[1].split()[0]
    expected = lines[1].split("expected:", 1)[1].strip()
    text = "\n".join(lines[2:]) + "\n"
    expected_case = None if expected == "none" else expected
    copied = ORIGINAL.search(lines[0]) if not url.startswith("https://github.com/") else None
    digest = hashlib.sha256(raw).hexdigest()
    return Fixture(path.name, url, expected_case, text, digest, half, path.parent.name, copied[1] if copied else "")


def load(halves: Tuple[str, ...] = HALVES) -> List[Fixture]:
    """Every fixture of the given halves (both by default), dev first, each folder by name. A dev-only run reads no
    file of the held-out half."""
    return [
        _read(path, half)
        for half, folders in FOLDERS.items()
        if half in halves
        for folder in folders
        for path in sorted(folder.glob("*.txt"))
    ]


def split_record(fixtures: List[Fixture]) -> dict:
    """The split as split.json records it: the version, the rule, the dev pastes' names, the test pastes' names and
    hashes (a test paste edited after the split was fixed shows as a changed hash)."""
    return {
        "version": SPLIT_VERSION,
        "rule": SPLIT_RULE,
        "dev": sorted(f.name for f in fixtures if f.half == "dev"),
        "test": {f.name: f.sha256 for f in sorted(fixtures, key=lambda f: f.name) if f.half == "test"},
    }


def recorded_split() -> dict:
    """The split as recorded when it was fixed (before any tuning on it), with the earlier versions as history."""
    return json.loads(SPLIT.read_text())


@dataclass
class Row:
    """What triage said of one fixture."""

    fixture: Fixture
    """The fixture."""
    first: Optional[str]
    """The case claimed first; None when nothing is claimed."""
    level: Optional[str]
    """The evidence level of that claim."""
    seconds: float
    """Time to triage it (parse and match)."""
    named: Tuple[str, ...] = ()
    """Every case claimed, best first (the first alone when the answer gives no more)."""


def measure(answer: Callable[[str], tuple], fixtures: List[Fixture]) -> List[Row]:
    """Run ``answer(text) -> (first case claimed, level[, every case claimed])`` on every fixture, with progress on
    stderr."""
    rows, start = [], time.perf_counter()
    for n, fx in enumerate(fixtures, 1):
        t = time.perf_counter()
        got = answer(fx.text)
        first, level = got[:2]
        named = tuple(got[2]) if len(got) > 2 else ((first,) if first else ())
        rows.append(Row(fx, first, level, time.perf_counter() - t, named))
        print(f"[{n}/{len(fixtures)}] {time.perf_counter() - start:.1f}s {fx.name}: {first}", file=sys.stderr)
    return rows


def table(rows: List[Row], misses: bool = True) -> str:
    """Precision, recall, claims on other pastes and median time, as a Markdown table; then the misses, named only
    when ``misses`` (never for the held-out half: a name seen is a paste tuned on)."""
    covered = [r for r in rows if r.fixture.expected]
    other = [r for r in rows if not r.fixture.expected]
    claimed = [r for r in rows if r.first]
    right = [r for r in claimed if r.first == r.fixture.expected]
    levels = sorted({r.level or "none" for r in claimed})
    median_ms = 1000 * statistics.median(r.seconds for r in rows)
    named = sum(r.first == r.fixture.expected for r in covered)
    anywhere = sum(r.fixture.expected in r.named for r in covered)
    strong_wrong = sum(r.level == "strong" and r.first != r.fixture.expected for r in rows)
    lines = [
        "| measure | result |",
        "| --- | --- |",
        f"| covered pastes named first (recall) | {named}/{len(covered)} |",
        f"| covered pastes named at all (any claim of theirs) | {anywhere}/{len(covered)} |",
        f"| claims that were right (precision) | {len(right)}/{len(claimed)} |",
        f"| other pastes with any claim | {sum(bool(r.first) for r in other)}/{len(other)} |",
        f"| strong claims that were wrong | {strong_wrong} |",
        f"| levels printed with the claims | {', '.join(levels)} |",
        f"| median time per paste (parse + match) | {median_ms:.1f} ms |",
    ]
    wrong = [
        f"- {r.fixture.name}: expected {r.fixture.expected}, got {r.first}"
        for r in rows
        if r.first != r.fixture.expected and misses
    ]
    return "\n".join(lines + ([""] + wrong if wrong else []))


def triage_answer(matrix) -> Callable[[str], tuple]:
    """This branch's triage: the first claimed case, its level, and every case claimed."""

    def answer(text: str) -> tuple:
        found = claims(match(matrix, parse(text)))
        every = tuple(m.case.id for m in found)
        return (found[0].case.id, found[0].level, every) if found else (None, None, ())

    return answer


def format_table(answer: Callable[[str], tuple], fixtures: List[Fixture]) -> str:
    """For each format of ``formats.FORMATS``: the covered pastes named first as pasted that are still named first in
    that format, and the other pastes claimed in it; with progress on stderr."""
    plain = {fx.name: answer(fx.text)[0] for fx in fixtures}
    named = [fx for fx in fixtures if fx.expected and plain[fx.name] == fx.expected]
    other = [fx for fx in fixtures if not fx.expected]
    lines = [
        "| format | covered named first (of those named as pasted) | other pastes with a claim |",
        "| --- | --- | --- |",
        f"| as pasted | {len(named)}/{len(named)} | {sum(bool(plain[fx.name]) for fx in other)}/{len(other)} |",
    ]
    start = time.perf_counter()
    for n, (name, form) in enumerate(FORMATS.items(), 1):
        kept = sum(answer(form(fx.text))[0] == fx.expected for fx in named)
        claimed = sum(bool(answer(form(fx.text))[0]) for fx in other)
        lines.append(f"| {name} | {kept}/{len(named)} | {claimed}/{len(other)} |")
        print(f"[{n}/{len(FORMATS)}] {time.perf_counter() - start:.1f}s {name}", file=sys.stderr)
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.triage.corpus", description=__doc__.splitlines()[0])
    p.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml")
    p.add_argument("--half", choices=HALVES + ("all",), default="all", help="which half to measure (default: both)")
    p.add_argument(
        "--formats",
        action="store_true",
        help="the dev half in each format of tests/triage/formats.py (wrapped, rich, log prefixes...); no test file",
    )
    args = p.parse_args(argv)
    matrix = load_matrix(args.matrix, check_repros=False)
    if args.formats:
        if args.half != "dev":
            p.error("--formats measures the dev half only: add --half dev")
        chosen = load(("dev",))
        print(f"## dev ({len(chosen)} pastes) in other formats\n\n{format_table(triage_answer(matrix), chosen)}")
        return 0
    halves = HALVES if args.half == "all" else (args.half,)
    fixtures = load(halves)
    for half in halves:
        chosen = [f for f in fixtures if f.half == half]
        print(f"## {half} ({len(chosen)} pastes, {sum(bool(f.expected) for f in chosen)} covered)\n")
        print(table(measure(triage_answer(matrix), chosen), misses=half == "dev") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
