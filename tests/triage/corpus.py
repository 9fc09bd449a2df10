"""The triage corpus: real pastes from upstream threads (tests/fixtures/triage/corpus/), each with its URL and the
case it should be named as first, or ``none`` for another failure; and the measure of triage on it.

``python -m tests.triage.corpus [--matrix FILE]`` prints the table: precision (claims that were right), recall
(covered pastes named first), claims on other pastes, median time per paste.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage.match import claims, match
from fsdp_matrix.triage.parse import parse

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "triage" / "corpus"


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


def load() -> List[Fixture]:
    """Every fixture of the corpus, by name."""
    out = []
    for path in sorted(CORPUS.glob("*.txt")):
        lines = path.read_text().splitlines()
        url = lines[0].split("source:", 1)[1].split()[0]
        expected = lines[1].split("expected:", 1)[1].strip()
        out.append(Fixture(path.name, url, None if expected == "none" else expected, "\n".join(lines[2:]) + "\n"))
    return out


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


def measure(answer: Callable[[str], Tuple[Optional[str], Optional[str]]], fixtures: List[Fixture]) -> List[Row]:
    """Run ``answer(text) -> (first case claimed, level)`` on every fixture, with progress on stderr."""
    rows, start = [], time.perf_counter()
    for n, fx in enumerate(fixtures, 1):
        t = time.perf_counter()
        first, level = answer(fx.text)
        rows.append(Row(fx, first, level, time.perf_counter() - t))
        print(f"[{n}/{len(fixtures)}] {time.perf_counter() - start:.1f}s {fx.name}: {first}", file=sys.stderr)
    return rows


def table(rows: List[Row]) -> str:
    """Precision, recall, claims on other pastes and median time, as a Markdown table."""
    covered = [r for r in rows if r.fixture.expected]
    other = [r for r in rows if not r.fixture.expected]
    claimed = [r for r in rows if r.first]
    right = [r for r in claimed if r.first == r.fixture.expected]
    levels = sorted({r.level or "none" for r in claimed})
    median_ms = 1000 * statistics.median(r.seconds for r in rows)
    named = sum(r.first == r.fixture.expected for r in covered)
    lines = [
        "| measure | result |",
        "| --- | --- |",
        f"| covered pastes named first (recall) | {named}/{len(covered)} |",
        f"| claims that were right (precision) | {len(right)}/{len(claimed)} |",
        f"| other pastes with any claim | {sum(bool(r.first) for r in other)}/{len(other)} |",
        f"| levels printed with the claims | {', '.join(levels)} |",
        f"| median time per paste (parse + match) | {median_ms:.1f} ms |",
    ]
    misses = [
        f"- {r.fixture.name}: expected {r.fixture.expected}, got {r.first}"
        for r in rows
        if r.first != r.fixture.expected
    ]
    return "\n".join(lines + ([""] + misses if misses else []))


def triage_answer(matrix) -> Callable[[str], Tuple[Optional[str], Optional[str]]]:
    """This branch's triage: the first claimed case and its level."""

    def answer(text: str) -> Tuple[Optional[str], Optional[str]]:
        found = claims(match(matrix, parse(text)))
        return (found[0].case.id, found[0].level) if found else (None, None)

    return answer


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.triage.corpus", description=__doc__.splitlines()[0])
    p.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml")
    args = p.parse_args(argv)
    matrix = load_matrix(args.matrix, check_repros=False)
    print(table(measure(triage_answer(matrix), load())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
