"""Read a traceback or log as users paste it: the exception lines and the frames, whatever the paste looks like.

Pastes come trimmed (no ``Traceback (most recent call last)``, only the last lines), prefixed per rank
(``[rank0]:``, or ``rank1]:`` with its bracket cut off), quoted in Markdown (``> ``, backticks, fences), wrapped at
the terminal's width, from IPython (``File /path/x.py:868, in f()``), from Windows, conda, site-packages or a source
checkout, with the exception class qualified by its module or not. Nothing here needs the paste to be complete.
"""

from __future__ import annotations

import html
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

PACKAGE_ROOTS = (
    "torch",
    "peft",
    "transformers",
    "accelerate",
    "bitsandbytes",
    "trl",
    "fsdp_matrix",
    "deepspeed",
    "megatron",
)
"""Top-level packages a frame's module is read from when its path has no site-packages/dist-packages part (a
source checkout such as ``~/src/peft/src/peft/tuners/lora/dora.py``)."""

# CSI (colours, cursor moves), OSC (title, hyperlink target, clipboard: its payload goes too), and the other ESC
# sequences; then every C0/C1 control but tab and newline: nothing of a paste may act on the terminal it is shown in
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?|\x1b[@-Z\\-_]|\x1b"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)
# per-rank prefixes of torchrun/accelerate output, also with the opening bracket cut off by a trimmed paste
_RANK_PREFIX = re.compile(r"^\s*\[?(?:rank|default)\d+\]?:\s?")
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
# what a log writes before each line: Ray's actor ("(WorkerDict pid=1234, ip=10.0.0.7) ": verl, OpenRLHF), a timestamp
# with a level and a logger or a file:line:function (logging's, CI's), logging's "WARNING:root:", srun -l's task and
# pdsh's host ("0: ", "worker-1: "); a rank prefix may follow any of them. A bracketed timestamp ("[2024-05-01 ...]
# [INFO]", DeepSpeed's and torchelastic's records) is kept: its "[" says a new record starts, not a wrapped message
_LOG_PREFIX = re.compile(
    r"^\s*(?:\((?:[A-Za-z_][\w.-]*\s+)?pid=\d+(?:,\s*ip=[\d.:a-fA-F]+)?\)"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
    rf"(?:\s*(?:-\s*[\w.]+\s*)?-\s*{_LEVEL}\s*-|\s*\[{_LEVEL}\]|\s+{_LEVEL}\b:?)?(?:\s*\[[\w.]+:\d+(?::[\w<>]+)?\])?"
    rf"|{_LEVEL}:[\w.]+:|\d{{1,4}}:(?=\s)|(?:worker-\d+|localhost|\d{{1,3}}(?:\.\d{{1,3}}){{3}}):(?=\s))\s?"
)
_LOG_PREFIXES = 3
"""How many log prefixes one line may carry (a timestamp, then Ray's actor, then a rank)."""
# what a web page or a chat leaves in copied text: zero-width characters and soft hyphens inside words
_INVISIBLE = re.compile("[\u00ad\u200b-\u200d\u2060]")
# UTF-8's three-byte characters read as Windows-1252 (a log saved or pasted in the wrong encoding): rich's boxes
# (│ as â”‚), arrows, typographic quotes
_MOJIBAKE = re.compile(
    "\u00e2[\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc"
    "\u2013\u2014\u2018-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122\ufffd]{2}"
)


# the same characters shown by a Windows console's code page 437 (│ as Γöé, ─ as ΓöÇ, ❱ as Γ¥▒)
_MOJIBAKE_437 = re.compile("\u0393[" + re.escape(bytes(range(0x80, 0xC0)).decode("cp437")) + "]{2}")


def _unmojibake(found: re.Match[str], codec: str = "cp1252") -> str:
    try:
        return found.group().encode(codec).decode("utf-8")
    except UnicodeError:
        return found.group()


def _unmojibake_437(found: re.Match[str]) -> str:
    return _unmojibake(found, "cp437")


# a traceback logged as one escaped string (a JSON record, a structured log, a repr()): its newlines are "\\n"
_ESCAPED_TRACE = re.compile(r"Traceback \(most recent call last\):\\n|\\n(?:\[?rank\d+\]?:)?\s*File \\?[\"']")
_ESCAPE = re.compile(r"\\[nt\"'\\]")


def _unescape(found: re.Match[str]) -> str:
    return {"\\n": "\n", "\\t": "\t"}.get(found.group(), found.group()[1])


_QUOTES = str.maketrans("\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f", "''''\"\"\"\"")
"""Typographic quotes (a forum's, a chat's, a word processor's) as the ASCII quotes Python prints."""
_ENTITY = re.compile(r"&(?:#\d{1,7}|#x[0-9a-fA-F]{1,6}|lt|gt|amp|quot|apos|nbsp);")
# Markdown quotes ("> "), Python prompts (">>> "), and pytest's failure lines ("E   ")
_QUOTE_PREFIX = re.compile(r"^\s*(?:(?:>\s?)+|E {2,})")
_FENCE = re.compile(r"^\s*(```|~~~)\w*\s*$")
# File "/x/y.py", line 3, in f   |   File /x/y.py:868, in f()   |   File [/x/y.py:868](https://...), in f()
_FRAME = re.compile(
    r"""File\s+(?:"(?P<q>[^"]+\.py)"|\[?(?P<p>[^\s"\[\]:,]+\.py))(?::\d+\]?(?:\([^)]*\))?)?"""
    r"""(?:,\s*line\s+\d+)?(?:,\s*in\s+(?P<fn>[\w.<>]+))?"""
)
# ValueError: ...  |  torch.distributed...ChildFailedError: ...  |  Exception: ...  (also inside "[...]" or a sentence)
_EXC = re.compile(
    r"(?:^|(?<=[\s\[(]))(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Failed|Exit|Interrupt)|Exception))"
    r":(?:\s+|$)(?P<msg>.*)$"
)
MAX_BYTES = 2 * 1024 * 1024
"""How much of a paste is read: a log of many ranks repeats itself, and the error is near its end or its start."""
MAX_ERRORS = 200
"""Distinct exception lines matched against the rules: the first and the last half of it (a run's first failure and
its final exception); every one costs a search per rule, and a long log of many ranks can hold tens of thousands."""
_WORDY = re.compile(r"\w")
_WRAPPED_LINES = 5
"""How many lines after an exception line may continue its wrapped message."""
# rich's traceback (transformers' and accelerate's CLIs, typer, Lightning): frames in a box, ``│ /x/y.py:12 in f │``,
# a long path wrapped across box lines ("...modules/m │" then "│ odule.py:1818 in state_dict"), even inside its line
# number ("modeling_llama.py:5 │" then "31 in forward"); see https://rich.readthedocs.io/en/stable/traceback.html
# rich draws its boxes in ASCII on a console that cannot print box characters ("+----+", "| ... |")
_BOX_SIDES = re.compile(r"^[│┃║|]\s?|\s?[│┃║|]$")
_BOX_RULE = re.compile(r"^[╭╰┏┗─━+\s]*(?:[─━]{3}|-{3})|^\?{8,}$")
# a line of the source rich shows around a frame: "  498 │   │   code" or, for the frame's own line, "❱ 499 │ code"
_RICH_SOURCE = re.compile(r"^(?P<mark>[❱>?])?\s*\d+\s*[│|?](?P<code>.*)$")
# a row of a box whose characters an ASCII-only encoding replaced by "?" ("? /x/y.py:12 in f ?")
_GARBLED_ROW = re.compile(r"^\?(?=\s)(.*\s)\?$")
# a frame's file as rich prints it: absolute, home-relative, or relative to the working directory (``src/train.py``)
_RICH_PATH = r"(?:[A-Za-z]:)?(?:[\\/~.]|\w[\w.-]*/)"
_RICH_FRAME = re.compile(rf"^(?P<path>{_RICH_PATH}[^\s│]*?\.py):(?P<line>\d+) in (?P<fn>[\w.<>]+)")
_RICH_REST = re.compile(r"^[\w.<>]+$")
_RICH_START = re.compile(rf"^{_RICH_PATH}[^\s│]*(?:\.py:\d+ i|\.py:\d+ in)?$")
_RICH_JOIN = 3
"""How many box lines one rich frame header may be wrapped over."""
_TRACE_LINE = re.compile(r"^\s*(Traceback \(most recent call last\)|File\s|During handling|The above exception|\^+|~+)")


@dataclass(frozen=True)
class Frame:
    """One traceback frame found in the paste."""

    path: str
    """The file as pasted, with forward slashes."""
    module: Optional[str]
    """Dotted module read from the path (``peft.tuners.lora.dora``), or None when no known root is in it."""
    function: Optional[str] = None
    """The function named after ``in``, when the paste has it."""


@dataclass(frozen=True)
class PastedError:
    """One exception line of the paste, with its wrapped continuation joined back."""

    type: str
    """The class as pasted: ``ValueError`` or ``torch.distributed.elastic...ChildFailedError``."""
    message: str
    """The message, whitespace collapsed."""
    raised_in: Optional[Frame] = None
    """The frame printed right above the exception line (the raise site of a whole traceback), if any."""
    frames: Tuple[Frame, ...] = ()
    """The frames printed between the previous exception line and this one: its own traceback's."""
    wrapped: Tuple[str, ...] = ()
    """The message's lines as pasted, when it was wrapped over several (a terminal wraps inside a word as often as
    at a space); empty when it is one line."""

    @property
    def spellings(self) -> List[str]:
        """The message, and each reading of its wrap points as a space or as nothing (at most the first three
        points read both ways; beyond them, a space)."""
        if len(self.wrapped) < 2:
            return [self.message]
        out = []
        for mask in range(2 ** min(len(self.wrapped) - 1, 3)):
            text = self.wrapped[0]
            for k, part in enumerate(self.wrapped[1:]):
                text += ("" if mask >> k & 1 else " ") + part
            out.append(" ".join(text.split()))
        return out

    @property
    def short_type(self) -> str:
        """The class name without its module."""
        return self.type.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Paste:
    """What could be read from a pasted traceback or log."""

    text: str
    """The paste cleaned of rank prefixes, quote marks, fences and ANSI colours, whitespace collapsed."""
    errors: List[PastedError] = field(default_factory=list)
    """Exception lines, innermost-last as pasted, duplicates (one per rank) removed."""
    frames: List[Frame] = field(default_factory=list)
    """Frames in paste order; the last one is nearest to where the error was raised."""
    lines: List[str] = field(default_factory=list)
    """The cleaned lines, each once: a title or a sentence that quotes a message without its class."""
    errors_left_out: int = 0
    """Distinct exception lines beyond ``MAX_ERRORS``, between the first and the last kept."""

    @property
    def modules(self) -> List[str]:
        return [f.module for f in self.frames if f.module]


def module_of(path: str) -> Optional[str]:
    """``.../site-packages/peft/tuners/lora/dora.py`` -> ``peft.tuners.lora.dora``; None when no root is known."""
    parts = [p for p in path.replace("\\", "/").split("/") if p and p != "."]
    if not parts or not parts[-1].endswith(".py"):
        return None
    parts[-1] = parts[-1][: -len(".py")]
    start = None
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            start = i + 1
    if start is None:
        roots = [i for i, part in enumerate(parts[:-1]) if part in PACKAGE_ROOTS]
        start = roots[-1] if roots else None
    if start is None or start >= len(parts):
        return None
    mod = [p for p in parts[start:] if p != "__init__"]
    return ".".join(mod) if mod and all(p.isidentifier() for p in mod) else None


def bounded(text: str, limit: int = MAX_BYTES) -> str:
    """The paste cut to ``limit`` bytes of UTF-8: the head and the tail, where a traceback's start and its exception
    line are (a rank's whole log pasted in the middle of them adds nothing but time)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    half = limit // 2
    return (data[:half] + b"\n" + data[-half:]).decode("utf-8", "replace")


def decode(data: bytes) -> str:
    """A paste's bytes as text: by its BOM (PowerShell's ``>`` writes UTF-16 with one), else UTF-8, an undecodable
    byte as U+FFFD."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, "replace")
    return data.decode("utf-8", "replace")


def plain(text: str) -> str:
    """``text`` without escape sequences and control characters but tab and newline (a NUL or a stray CR is a
    space, a backspace nothing)."""
    text = _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", ""))
    text = _MOJIBAKE.sub(_unmojibake, text) if "\u00e2" in text else text
    text = _MOJIBAKE_437.sub(_unmojibake_437, text) if "\u0393" in text else text
    text = _ESCAPE.sub(_unescape, text) if _ESCAPED_TRACE.search(text) else text
    # a paste from a page's HTML keeps its entities (&#39;, &gt;); one from a chat, invisible characters in words
    text = _INVISIBLE.sub("", html.unescape(text) if _ENTITY.search(text) else text).translate(_QUOTES)
    return _CONTROL.sub(lambda m: " " if m.group() in "\x00\t\x0b\x0c" else "", text)


def clean_lines(text: str) -> List[str]:
    """The paste's lines without control sequences, rank prefixes, Markdown quote marks, fences and stray
    backticks."""
    out = []
    for raw in plain(text).split("\n"):
        line = _QUOTE_PREFIX.sub("", raw)
        for _ in range(_LOG_PREFIXES):
            line = _LOG_PREFIX.sub("", _RANK_PREFIX.sub("", line))
        if _FENCE.match(line):
            continue
        # a traceback quoted inline in Markdown: `[rank0]: ... ValueError: ...` with the backticks kept
        line = line.strip().strip("`").strip()
        line = _RANK_PREFIX.sub("", line)
        out.append(line)
    return out


def _unbox(line: str) -> Tuple[str, str]:
    """A line as (kind, text): ``rule`` for a rich box's top or bottom, ``blank`` for an empty row, ``source`` for a
    line of the source rich shows around a frame's own line, else ``line`` with the box's sides taken off
    (``│ text │`` -> ``text``; the frame's own source line, ``❱ 499 │ code``, as Python prints it: ``code``)."""
    if _BOX_RULE.match(line):
        return "rule", ""
    line = _GARBLED_ROW.sub(r"│\1│", line)
    if not line or (line[0] not in "│┃║|" and line[-1] not in "│┃║|"):
        return "line", line
    inner = _BOX_SIDES.sub("", _BOX_SIDES.sub("", line)).strip()
    source = _RICH_SOURCE.match(inner)
    if source:
        code = source.group("code").lstrip("│|? ").strip()
        return ("line", code) if source.group("mark") else ("source", code)
    return ("line", inner) if inner else ("blank", "")


def _unboxed(lines: List[str]) -> List[Optional[str]]:
    """``lines`` without rich's boxes: a box's top rule is a blank line (it ends a wrapped message), its bottom rule
    goes (the exception line follows the last frame, as Python prints it), a blank row is None (gone:
    Python prints none between a frame and its exception line; a frame header is not wrapped over one), and the source
    rich shows around each frame's own line moves above the box (its words are still the paste's, but Python would
    not print them between a frame and the exception line)."""
    out: List[Optional[str]] = []
    around: List[Optional[str]] = []
    box_at: Optional[int] = None
    for kind, text in map(_unbox, lines):
        if kind == "rule" and box_at is None:
            box_at = len(out)
            out.append("")
        elif kind == "rule":  # the box closes: its exception line follows, as in Python's traceback
            out[box_at:box_at] = around
            around, box_at = [], None
        elif kind == "source":
            (around if box_at is not None else out).append(text)
        else:
            out.append(text if kind == "line" else None)
    if box_at is not None:
        out[box_at:box_at] = around
    return out


def _rich_header(inner: List[Optional[str]], i: int) -> Tuple[Optional[str], int]:
    """The rich frame header that starts at ``inner[i]``, joined back where the box wrapped it (inside its path, its
    line number or its function's name), as Python's ``File "path", line N, in f``; and how many rows it took."""
    joined, used = inner[i] or "", 1
    while not _RICH_FRAME.match(joined) and _RICH_START.match(joined) and used <= _RICH_JOIN:
        if i + used >= len(inner) or inner[i + used] is None:
            break
        joined, used = joined + (" " if joined.endswith(" in") else "") + (inner[i + used] or ""), used + 1
    found = _RICH_FRAME.match(joined)
    if not found or (used > 1 and not _RICH_START.match(inner[i] or "")):
        return None, 1
    # the box may wrap inside the function's name too ("in _load_p" / "retrained_model"): the rest is the next row
    while found.end() == len(joined) and i + used < len(inner) and _RICH_REST.match(inner[i + used] or ""):
        joined, used = joined + (inner[i + used] or ""), used + 1
        found = _RICH_FRAME.match(joined) or found
    return f'File "{found.group("path")}", line {found.group("line")}, in {found.group("fn")}', used


def rich_frames(lines: List[str]) -> List[str]:
    """``lines`` with rich's boxes taken off (``_unboxed``) and each of its frame headers written as Python's
    ``File "path", line N, in f`` (what the rest of the parser reads): the last frame stands right above the exception
    line, as its raise site."""
    inner = _unboxed(lines)
    out: List[str] = []
    i = 0
    while i < len(inner):
        header, used = _rich_header(inner, i)
        line = header or inner[i]
        if line is not None:
            out.append(line)
        i += used
    return out


def _exception_at(
    lines: List[str], i: int, above: Optional[Frame] = None, frames: Tuple[Frame, ...] = ()
) -> Optional[PastedError]:
    found = _EXC.search(lines[i])
    if not found:
        return None
    parts = [found.group("msg")]
    # a message wrapped by the terminal or the width: join the lines up to the next blank or trace line
    for nxt in lines[i + 1 : i + 1 + _WRAPPED_LINES]:
        # a line of punctuation only (a log record's closing '"}') is no part of a message
        if not nxt or _TRACE_LINE.match(nxt) or _EXC.search(nxt) or nxt.startswith("[") or not _WORDY.search(nxt):
            break
        parts.append(nxt)
    wrapped = tuple(parts) if len(parts) > 1 else ()
    return PastedError(found.group("type"), " ".join(" ".join(parts).split()), above, frames, wrapped)


_RAISE_GAP = 3
"""Lines (source, carets, ``raise ValueError(``) that may stand between a raise site's frame and the exception."""
_OWN_GAP = 8
"""Lines that may stand between a traceback's last frame and its exception line (a statement's source over several
lines, carets, a wrapped ``raise``); frames further above belong to another traceback."""
# a frame line as Python prints it, whole: what a wrapped one is joined back into
_WHOLE_FRAME = re.compile(r'^File\s+"[^"]+\.py",\s*line\s+\d+,\s*in\s+[\w.<>]+$')
_FRAME_HEAD = re.compile(r'^File(?:\s+"|$)')
_FRAME_JOIN = 3
"""How many lines one ``File "..."`` line may be wrapped over (a long site-packages path at 80 columns)."""


def unwrap_frames(lines: List[str]) -> List[str]:
    """``lines`` with each ``File "..."`` line that a terminal or an issue's width wrapped (inside its path, its line
    number or its function's name, or at a space) joined back, when joining makes a whole frame line; the lines it was
    wrapped over go, so that a raise site's distance to its exception line is as printed."""
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        joined = None
        if _FRAME_HEAD.match(line) and not _WHOLE_FRAME.match(line):
            # a break inside a word leaves no space at the wrap point; a break at a space lost it to the strip
            joined = next(
                (
                    (line + sep.join([""] + lines[i + 1 : i + 1 + n]), n)
                    for n in range(1, _FRAME_JOIN + 1)
                    if i + n < len(lines)
                    for sep in ("", " ")
                    if _WHOLE_FRAME.match(line + sep + sep.join(lines[i + 1 : i + 1 + n]))
                ),
                None,
            )
        if joined:
            out.append(joined[0])
            i += joined[1] + 1
            continue
        out.append(line)
        i += 1
    return out


def parse(text: str) -> Paste:
    """Read the exception lines and frames of a paste (at most ``MAX_BYTES`` of it); either may be empty. A line
    seen before (every rank prints the same traceback) is read once, in one pass: a repeated frame still counts as
    the frame above the exception line that follows it."""
    lines = unwrap_frames(rich_frames(clean_lines(bounded(text))))
    errors: List[PastedError] = []
    later: Deque[PastedError] = deque(maxlen=MAX_ERRORS - MAX_ERRORS // 2)
    said = set()
    frames: List[Frame] = []
    seen: Dict[str, Optional[Frame]] = {}
    unique: List[str] = []
    last: Optional[Frame] = None
    last_at = -1
    current: List[Frame] = []  # the frames since the last exception line: the traceback being read
    blank_since = False  # a blank line since the last frame: Python prints none inside a traceback
    for i, line in enumerate(lines):
        if line and line in seen:
            if seen[line] is not None:
                last, last_at = seen[line], i
                current.append(last)
            elif _EXC.search(line):
                current = []
            continue
        blank_since = blank_since or not line
        here = None
        for found in _FRAME.finditer(line):
            path = (found.group("q") or found.group("p")).replace("\\", "/")
            here = Frame(path, module_of(path), found.group("fn"))
            frames.append(here)
            current.append(here)
        if here is not None:
            last, last_at, blank_since = here, i, False
        seen[line] = here
        unique.append(line)
        # frames far above the exception line, or above a blank line, are a traceback cut before its own exception
        # (or one whose exception a title quotes above it), not this exception's: two tracebacks keep their frames
        own = tuple(current) if 0 < i - last_at <= _OWN_GAP and not blank_since else ()
        err = _exception_at(lines, i, last if 0 < i - last_at <= _RAISE_GAP else None, own)
        if err:
            current = []
        if err and (err.type, err.message) not in said:
            said.add((err.type, err.message))
            (errors if len(errors) < MAX_ERRORS // 2 else later).append(err)
    left_out = max(0, len(said) - MAX_ERRORS)
    text = " ".join(" ".join(unique).split())
    return Paste(text, errors + list(later), frames, [x for x in unique if x], left_out)
