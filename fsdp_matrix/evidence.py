"""The evidence behind matrix.yaml's rules: what was read and observed, kept out of the rule grammar.

A rule's ``source:`` is one line (the upstream link, the combos it was observed on). The longer account lives in
``docs/pages/evidence/<case>.md`` beside matrix.yaml, one ``## <case>/<rule id>`` section per rule (platform rules:
``docs/pages/evidence/platform.md``, ``## platform/<id>``). Those pages are part of the docs site; ``explain`` prints a
rule's section beside the rule, and ``validate`` checks that every section belongs to a rule. A rule whose one-line
source says everything needs no section.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

PLATFORM = "platform"
"""The evidence file (and id prefix) of the platform's skips and signatures; no case may take this id."""


@dataclass(frozen=True)
class Section:
    """One ``## <rule id>`` section of an evidence file."""

    rule: str
    """The rule id of its heading: ``<case>/<rule id>`` or ``platform/<id>``."""
    file: str
    """The file's name, e.g. ``dora-sharded-weight.md``."""
    line: int
    """Line of the heading (1-based)."""
    text: str
    """The section's text, without its heading, stripped."""


def read_file(path: Path) -> List[Section]:
    """The ``## `` sections of one evidence file, in order (text before the first heading is the page's intro)."""
    out: List[Section] = []
    heading: Optional[str] = None
    start, body = 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("## "):
            if heading is not None:
                out.append(Section(heading, path.name, start, "\n".join(body).strip()))
            heading, start, body = line[3:].strip(), number, []
        elif heading is not None:
            body.append(line)
    if heading is not None:
        out.append(Section(heading, path.name, start, "\n".join(body).strip()))
    return out


def read_all(folder: Optional[Path]) -> List[Section]:
    """Every section of every ``*.md`` in ``folder`` (none when it is None or missing), by file name."""
    if folder is None or not folder.is_dir():
        return []
    return [s for path in sorted(folder.glob("*.md")) for s in read_file(path)]


def for_rule(folder: Optional[Path], rule: str) -> Optional[str]:
    """The evidence text of ``rule`` (``<case>/<id>``), read from its case's file, or None."""
    if folder is None:
        return None
    path = folder / f"{rule.split('/', 1)[0]}.md"
    if not path.is_file():
        return None
    return next((s.text for s in read_file(path) if s.rule == rule), None)


def problems(sections: List[Section], rule_ids: Set[str]) -> List[Tuple[str, str]]:
    """What ``validate`` reports: a section whose heading names no rule, a section in another case's file, a rule
    with two sections."""
    out: List[Tuple[str, str]] = []
    seen: Dict[str, Section] = {}
    for s in sections:
        where = f"docs/pages/evidence/{s.file}:{s.line}"
        if s.rule not in rule_ids:
            out.append((where, f"section {s.rule!r} names no rule of matrix.yaml (headings are ## <case>/<rule id>)"))
        elif f"{s.rule.split('/', 1)[0]}.md" != s.file:
            out.append((where, f"section {s.rule!r} belongs in {s.rule.split('/', 1)[0]}.md"))
        elif s.rule in seen:
            out.append((where, f"second section for {s.rule!r} (first on line {seen[s.rule].line})"))
        seen.setdefault(s.rule, s)
    return out
