"""The dev pastes as a terminal, a log or a web page would show them: each format is a function of the pasted text.

Issue 36 lists what real pastes look like besides a clean traceback: wrapped at a width (inside words too), rich's
boxes, colours, log prefixes, pages' entities and quotes. The corpus holds few of each, so triage's handling of them
is measured here on every dev paste turned into each format (``python -m tests.triage.corpus --formats``): a covered
paste named first as pasted should still be named first, and an other paste should still get no claim. These are
synthetic variants of the half triage is tuned on, not pastes it never saw: they say what a format costs, not how
triage holds on new reports.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Callable, Dict

_RANK = re.compile(r"^\s*\[?rank\d+\]?:")
_FRAME = re.compile(r'^(\s*(?:\[?rank\d+\]?:)?\s*)File "([^"]+)", line (\d+), in (\S+)\s*$')


def _per_line(prefix: str) -> Callable[[str], str]:
    return lambda text: "\n".join(prefix + line if line.strip() else line for line in text.split("\n"))


def _word_wrap(width: int) -> Callable[[str], str]:
    """Wrapped at ``width`` between words where it can, inside a longer word where it must (an issue's or an
    e-mail's width)."""

    def wrap(text: str) -> str:
        return "\n".join(
            "\n".join(textwrap.wrap(line, width, break_on_hyphens=False, drop_whitespace=False) or [""])
            for line in text.split("\n")
        )

    return wrap


def _cut_at(width: int) -> Callable[[str], str]:
    """Cut every ``width`` characters, inside words (a terminal's copy)."""
    return lambda text: "\n".join(
        "\n".join(line[i : i + width] for i in range(0, max(len(line), 1), width)) for line in text.split("\n")
    )


def _rich_rows(match: re.Match[str], code: str, width: int, box: str) -> list:
    side, arrow = box[5], box[6]
    header = f"{match.group(2)}:{match.group(3)} in {match.group(4)}"
    rows = [header[k : k + width - 4] for k in range(0, len(header), width - 4)] + [""]
    rows += [f"{arrow} {match.group(3)} {side}   {code.strip()}"[: width - 4], ""] if code else []
    return [f"{side} {row:<{width - 4}} {side}" for row in rows]


def rich(text: str, width: int = 100, box: str = "╭─╮╰╯│❱") -> str:
    """Python's tracebacks in ``text`` drawn as rich draws them: frames in a box (``│ path:N in f │``, wrapped at the
    box's width), the frame's source line marked, the exception line after the box."""
    top_left, rule, top_right, bottom_left, bottom_right = box[:5]
    lines, out, inside, i = text.split("\n"), [], False, 0
    while i < len(lines):
        found = _FRAME.match(lines[i])
        if found:
            if not inside:
                title = " Traceback (most recent call last) "
                half = (width - 2 - len(title)) // 2
                out.append(top_left + rule * half + title + rule * (width - 2 - half - len(title)) + top_right)
                inside = True
            below = _RANK.sub("", lines[i + 1]) if i + 1 < len(lines) else ""
            code = below if below.startswith("    ") and not _FRAME.match(below) else ""
            out += _rich_rows(found, code, width, box)
            i += 2 if code else 1
            continue
        if inside and re.match(r"^\s*[\^~]+\s*$", lines[i]):
            i += 1
            continue
        if inside:
            out.append(bottom_left + rule * (width - 2) + bottom_right)
            inside = False
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _curly(text: str) -> str:
    return re.sub(r"'([^'\n]*)'", "\u2018\\1\u2019", text).replace('"', "\u201c")


def _json_log(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '{"level": "error", "msg": "' + escaped + '"}\n'


FORMATS: Dict[str, Callable[[str], str]] = {
    "word-wrapped at 80 columns": _word_wrap(80),
    "cut every 100 columns": _cut_at(100),
    "cut every 60 columns": _cut_at(60),
    "a timestamp, level and logger on each line": _per_line("2024-05-01 12:00:00,123 - root - ERROR - "),
    "Ray's actor on each line": _per_line("(WorkerDict pid=12345, ip=10.0.0.7) "),
    "srun -l's task on each line": _per_line("0: "),
    "HTML-escaped": html.escape,
    "typographic quotes": _curly,
    "zero-width spaces in words": lambda text: text.replace("_", "_\u200b"),
    "ANSI colours": lambda text: re.sub(r"(\w+Error)", "\x1b[1;31m\\1\x1b[0m", text),
    "rich traceback": rich,
    "rich traceback in ASCII": lambda text: rich(text, box="+-+++|>"),
    "rich traceback, UTF-8 read as cp1252": lambda text: rich(text).encode("utf-8").decode("cp1252", "replace"),
    "one JSON-escaped log record": _json_log,
}
"""Each format's name and what it does to a paste."""
FORMATS.update(
    {
        "rich traceback, UTF-8 shown as cp437 (a Windows console)": lambda text: (
            rich(text).encode("utf-8").decode("cp437", "replace")
        ),
        "rich traceback, box characters as '?'": lambda text: rich(text).encode("ascii", "replace").decode("ascii"),
    }
)
