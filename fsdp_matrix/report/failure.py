"""What a cell that failed says: the verdict line, then each rank's status, exit signal, traceback or hang stack.

The pytest plugin prints it, JUnit puts it in ``<failure>``, and the HTML page shows the same pieces per rank.
It goes to a terminal: control characters from a record (a colored log in a traceback) are shown as ``\\xNN``.
"""

from __future__ import annotations

import json

from fsdp_matrix.records import RankResult, Record
from fsdp_matrix.report.text import shown_lines


def rank_heading(rank: RankResult) -> str:
    """``rank 1: crash, exit code -9 (SIGKILL)``: who, and how it ended."""
    head = f"rank {rank.rank}: {rank.status}"
    if rank.exit_code is not None:
        head += f", exit code {rank.exit_code}" + (f" ({rank.signal})" if rank.signal else "")
    elif rank.signal:
        head += f" ({rank.signal})"
    return head


def rank_text(rank: RankResult) -> str:
    """The heading, then the rank's traceback and stack dump, or its checks when it passed them."""
    parts = [rank_heading(rank)]
    parts += [text.rstrip() for text in (rank.traceback, rank.stack) if text]
    if rank.status == "ok" and rank.checks:
        parts.append("checks: " + json.dumps(rank.checks, sort_keys=True, default=str))
    return "\n".join(parts)


def failure_text(rec: Record) -> str:
    """The one-line verdict, then what each rank said."""
    text = "\n".join([f"{rec.verdict}: {rec.key}: {rec.line}"] + [f"--- {rank_text(r)}" for r in rec.observed.ranks])
    return shown_lines(text)
