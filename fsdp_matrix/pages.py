"""``python -m fsdp_matrix docs [--write]``: the figures the docs quote from matrix.yaml, written by one command.

A new case changes three things outside its own two files: the case counts in README.md and docs/pages/cases.md
("45 cases, 325 cells per CPU combo (2 ranks), 13 CPU combos ...", "13 torch-axis combos") and the cases table of
docs/pages/cases.md. ``docs`` checks them against matrix.yaml and names what is stale (exit 1); ``docs --write``
rewrites them in place. A table row a person wrote (its upstream and "what it shows" columns) is kept as written; a
case without a row gets one from its ``report`` and ``title``; the row of a case no longer in matrix.yaml goes.
tests/test_readme.py runs the check, so a stale page fails ``nox -s tests`` with this command in its message.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

from fsdp_matrix.matrix import Matrix, load_matrix
from fsdp_matrix.usage import OneLineParser

WRITE = "python -m fsdp_matrix docs --write"
"""The one command that brings every generated figure up to date (quoted by every stale-page message)."""
PAGES = ("README.md", "docs/pages/cases.md")
"""The pages that quote the counts; the second holds the cases table."""
COUNTS = re.compile(r"(\d+) cases, (\d+) cells per CPU combo \((\d+) ranks\), (\d+) CPU combos")
TORCH = re.compile(r"(\d+) torch-axis combos")
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| ([^|]+) \|(.*)$", re.M)
URL = re.compile(r"https://github\.com/[\w.-]+/([\w.-]+)/(issues|pull)/(\d+)")


def _tagged(matrix: Matrix, tag: str) -> int:
    return sum(tag in combo.tags for combo in matrix.combos)


def counts(text: str, matrix: Matrix) -> str:
    """``text`` with every case-count sentence and torch-axis figure set from ``matrix``."""
    from fsdp_matrix.cells import expand

    def sentence(m: re.Match) -> str:
        ranks = int(m.group(3))
        cells = len(expand(matrix, world_size=ranks))
        cpu = _tagged(matrix, "cpu")
        return f"{len(matrix.cases)} cases, {cells} cells per CPU combo ({ranks} ranks), {cpu} CPU combos"

    text = COUNTS.sub(sentence, text)
    return TORCH.sub(f"{_tagged(matrix, 'torch')} torch-axis combos", text)


def upstream(report: str) -> str:
    """The table's upstream column for a case that has no row yet: its report's first GitHub link, shortened as the
    table writes it (``peft#1702``, ``accelerate PR #3762``), or the report itself."""
    m = URL.search(report)
    if not m:
        return report.replace("|", "/").replace("\n", " ").strip()
    repo, kind, number = m.groups()
    return f"{repo}#{number}" if kind == "issues" else f"{repo} PR #{number}"


def cases_table(text: str, matrix: Matrix) -> str:
    """``text`` (docs/pages/cases.md) with one row per case of ``matrix``: written rows kept, in their order; new
    cases appended in matrix.yaml's order; rows of removed cases dropped."""
    rows = list(ROW.finditer(text))
    if not rows:
        raise ValueError("docs/pages/cases.md: no '| `case` | upstream | ... |' table row to start from")
    written: Dict[str, str] = {m.group(1): m.group(0) for m in rows}
    ids = [c.id for c in matrix.cases]
    kept = [written[i] for i in written if i in ids]
    title = {c.id: c.title.replace("|", "/").replace("\n", " ") for c in matrix.cases}
    new = [f"| `{c.id}` | {upstream(c.report)} | {title[c.id]} |" for c in matrix.cases if c.id not in written]
    start, end = rows[0].start(), rows[-1].end()
    return text[:start] + "\n".join(kept + new) + text[end:]


def generated(root: Path, matrix: Matrix) -> Dict[str, str]:
    """``{page: its text with every generated figure current}`` for each page of PAGES."""
    out = {}
    for page in PAGES:
        text = counts((root / page).read_text(), matrix)
        out[page] = cases_table(text, matrix) if page.endswith("cases.md") else text
    return out


def stale(root: Path, matrix: Optional[Matrix] = None) -> List[str]:
    """The pages whose generated figures differ from matrix.yaml's (empty when every page is current)."""
    matrix = matrix or load_matrix(root / "matrix.yaml")
    return [page for page, text in generated(root, matrix).items() if (root / page).read_text() != text]


def stale_message(pages: List[str]) -> str:
    return f"{', '.join(pages)}: counts or cases table differ from matrix.yaml; run `{WRITE}`"


def main(argv: List[str]) -> int:
    """Check (or with --write, rewrite) the case counts and the cases table against matrix.yaml."""
    p = OneLineParser(prog="fsdp_matrix docs", description=main.__doc__)
    p.add_argument("--write", action="store_true", help="rewrite the stale pages in place")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository root")
    args = p.parse_args(argv)
    matrix = load_matrix(args.root / "matrix.yaml")
    pages = generated(args.root, matrix)
    behind = [page for page, text in pages.items() if (args.root / page).read_text() != text]
    if not behind:
        print(f"ok: {', '.join(PAGES)} are current ({len(matrix.cases)} cases)")
        return 0
    if not args.write:
        print(f"fsdp_matrix docs: {stale_message(behind)}", file=sys.stderr)
        return 1
    for page in behind:
        (args.root / page).write_text(pages[page])
        print(f"wrote {page}")
    return 0
