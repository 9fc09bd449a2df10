"""The markdown snippet next to an exported script: what an upstream issue needs, ready to paste. Versions, the
command, expected vs observed, and the traceback."""

from __future__ import annotations

import datetime
import re
import shlex
from pathlib import Path
from typing import Any, List, Optional

from fsdp_matrix.expectations import Expected
from fsdp_matrix.export.script import Export, expected_text
from fsdp_matrix.matrix import PACKAGES
from fsdp_matrix.records import Record, off_pins, recorded_version


def code_span(text: str) -> str:
    """Inline code that shows ``text`` verbatim, whatever backticks it holds (CommonMark: a longer fence)."""
    text = " ".join(text.split("\n"))
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def code_block(text: str, lang: str = "") -> str:
    """A fenced block longer than any backtick run inside, so a traceback holding ``` stays one block."""
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`{3,}", text)), default=0) + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


_PACKAGES_DIR = re.compile(r"[^\s\"'()]*/(?:site|dist)-packages/")
_STDLIB_DIR = re.compile(r"[^\s\"'()]*/lib/python3\.\d+/")
# any other absolute path (a scratch folder, a home directory): keep its last component only; the lookbehind
# leaves URLs (https://...) and relative paths alone
_OTHER_ABS = re.compile(r"(?<![\w.:/~-])(?:/[^\s\"'/:()]+)+/(?=[^\s\"'/:()]+)")
_CHECKOUT = str(Path(__file__).resolve().parents[2]) + "/"


def scrub(text: str, host: str = "") -> str:
    """``text`` as a reporter would paste it upstream: package-relative paths, no checkout, venv or home folder, no
    host name. ``.../site-packages/torch/x.py`` becomes ``torch/x.py``, the checkout's files ``fsdp_matrix/...``."""
    text = text.replace(_CHECKOUT, "")
    text = _PACKAGES_DIR.sub("", text)
    text = _STDLIB_DIR.sub("", text)
    text = _OTHER_ABS.sub(".../", text)
    if host:
        text = re.sub(rf"\b{re.escape(host)}\b", "<host>", text)
    return text


def _cell(text: str) -> str:
    # a table cell ends at an unescaped pipe, even inside a code span
    return text.replace("|", "\\|")


def _first_error(rec: Record) -> Optional[Any]:
    return next((r for r in rec.observed.ranks if r.status != "ok" and (r.traceback or r.stack)), None)


def _versions_table(exp: Export) -> List[str]:
    pins = exp.combo.pins.model_dump()
    rec = exp.record
    head = f"| package | pinned (combo `{exp.combo.id}`) |" + (" recorded |" if rec else "")
    rows = [head, "| --- | --- |" + (" --- |" if rec else "")]
    for name in PACKAGES + (("python",) if rec else ()):
        recorded = f" {_cell(recorded_version(rec, name))} |" if rec else ""
        rows.append(f"| {name} | {pins.get(name, '-')} |{recorded}")
    if exp.combo.extra:
        rows.append(f"| extra | {_cell(', '.join(exp.combo.extra))} |" + (" |" if rec else ""))
    return rows


def _observed(exp: Export, script: str) -> List[str]:
    """What the record observed (with the versions it ran when they are not the pins), or how to get it."""
    expected, rec, lines = exp.expected, exp.record, []
    if rec is not None:
        obs = rec.observed
        when = datetime.datetime.fromtimestamp(rec.finished_at).strftime("%Y-%m-%d %H:%M")
        if obs.status == "error":
            what = code_span(f"{obs.error_type}: {obs.error_message}")
            where = f" in {code_span(obs.location)}" if obs.location else ""
            lines.append(f"**Observed** ({when}, verdict {rec.verdict}): {what}{where}")
        else:
            lines.append(f"**Observed** ({when}, verdict {rec.verdict}): {obs.status}")
        if not exp.expected.judges_like(rec.expected):
            # the verdict above was judged under the rule of its day: say so rather than quote it as today's
            then = expected_text(Expected.from_json(rec.expected))
            lines += [
                "",
                f"**Note**: matrix.yaml's rule for this cell changed since this record: it expected "
                f"{code_span(then)} then, {code_span(expected_text(expected))} now; the verdict above is the old "
                "rule's (run the cell again for today's).",
            ]
        off = off_pins(rec, exp.combo.pins.model_dump())
        if off:
            lines += [
                "",
                f"**Note**: this record ran {', '.join(off)}, not the pins above (the script installs the pins).",
            ]
        failed = _first_error(rec)
        if failed is not None:
            # recorded by the harness: its own frames lead, the library frames are the ones the script hits too
            lines += [
                "",
                f"Traceback (rank {failed.rank}, as recorded by fsdp-matrix):",
                "",
                code_block(failed.traceback or failed.stack, "text"),
            ]
        elif obs.checks:
            lines += ["", "Checks:", "", code_block("\n".join(f"{k}: {v}" for k, v in obs.checks.items()), "text")]
    else:
        lines.append(
            f"**Observed**: no record of this cell for combo `{exp.combo.id}`; fsdp-matrix expects "
            f"{code_span(expected_text(expected))} (source: {expected.source or 'no rule'}). Run "
            f"`{script}` to obtain the traceback."
        )
    return lines


def render_markdown(exp: Export) -> str:
    script = f"{exp.stem}.py"
    pip = " ".join(shlex.quote(r) for r in exp.combo.requirements())
    title = exp.case.title
    rec = exp.record
    if exp.expected.kind == "error":
        title += f" ({exp.expected.error_type})"
    lines = [
        f"### {title}",
        "",
        f"Reproduces {exp.case.report} on {exp.cell.world_size} ranks ({exp.cell.device}), with tiny random-init "
        f"models and no download. Cell {code_span(exp.cell.key)} of fsdp-matrix, params "
        f"{code_span(repr(exp.cell.params_dict))}.",
        "",
        "**Versions**",
        "",
        *_versions_table(exp),
        "",
        "**To reproduce** (the script is self-contained: its PEP 723 header pins the versions above)",
        "",
        code_block(f"uv run {script}\n# or\npip install {pip} && python {script}", "bash"),
        "",
        "It names no package index: on a CPU-only machine point uv or pip at a CPU build of torch "
        "(e.g. `UV_EXTRA_INDEX_URL=<your CPU torch index> UV_INDEX_STRATEGY=unsafe-best-match`).",
        "",
        "**Expected**: training runs 3 AdamW steps: finite loss, non-zero adapter gradients, unchanged frozen "
        "weights, changed adapter weights.",
        "",
    ]
    lines += _observed(exp, script)
    # the record carries this machine's paths and host name; none of that belongs in an upstream issue
    return scrub("\n".join(lines) + "\n", rec.host if rec is not None else "")
