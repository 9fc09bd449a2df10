"""``python -m fsdp_matrix history add RESULTS --db FILE`` and ``history hud --db FILE -o hud.html``.

``add`` writes one night's records (the newest record of every cell under RESULTS, with the confirmations the
nightly appended) into the DB, with what the night's bisects named when given ``--nightly nightly.json``. A night
already in the DB from the same runs is not written again (exit 0, said on stderr); a night id held by other runs is
refused (exit 2). ``hud`` writes the static HUD page of the last
``--nights`` nights. Exit 2 on unusable input, in one line.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from fsdp_matrix.errors import MatrixError
from fsdp_matrix.history.db import HistoryError, Night, add_night, culprits_from_nightly, db_error
from fsdp_matrix.history.hud import MAX_NIGHTS, load_hud, render_hud
from fsdp_matrix.paths import writable_file
from fsdp_matrix.records import Skipped, iter_records, latest
from fsdp_matrix.usage import OneLineParser, flat


def _night(results: Path, name: Optional[str], nightly: Optional[Path]) -> Night:
    if not results.exists():
        raise HistoryError(f"{results}: no such results dir or cells.jsonl")
    skipped: List[Skipped] = []
    records = list(latest(iter_records(results, skipped)).values())
    if not records:
        raise HistoryError(
            f"{results}: no cell records" + (f" ({len(skipped)} lines are not records)" if skipped else "")
        )
    for skip in skipped:
        print(f"history: {skip}", file=sys.stderr)
    night = Night(name or "", records, str(results))
    night.night = name or night.default_id()
    if nightly is not None:
        try:
            night.culprits = culprits_from_nightly(json.loads(nightly.read_text(encoding="utf-8")))
        except (OSError, ValueError, AttributeError) as exc:
            raise HistoryError(f"--nightly {nightly}: not a nightly --json file: {exc}") from None
    return night


def add_main(args) -> int:
    night = _night(args.results, args.night, args.nightly)
    why = add_night(args.db, night)
    if why:
        print(f"history add: {why}: not written again", file=sys.stderr)
        return 0
    print(
        f"history add: night {night.night}: {len(night.records)} cells, "
        f"{len(night.culprits)} bisect answers -> {args.db}"
    )
    return 0


def hud_main(args) -> int:
    if not args.db.is_file():
        raise HistoryError(f"--db {args.db}: no such file")
    writable_file(args.out, "-o")
    hud = load_hud(args.db, args.nights)
    args.out.write_text(render_hud(hud, str(args.db)), encoding="utf-8")
    print(f"history hud: {len(hud.nights)} nights, {len(hud.rows)} cells, {hud.alerts()} -> {args.out}")
    return 0


def _nights(text: str) -> int:
    """An argparse type: a number of nights from 1 to ``MAX_NIGHTS`` (0 or -1 used to show every night)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of nights") from None
    if not 1 <= value <= MAX_NIGHTS:
        raise argparse.ArgumentTypeError(f"{text}: give 1 to {MAX_NIGHTS} nights")
    return value


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m fsdp_matrix history", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    add = sub.add_parser("add", help="add one night's records to the DB")
    add.add_argument("results", type=Path, help="the night's results dir (every cells.jsonl under it)")
    add.add_argument("--db", type=Path, required=True, help="the history DB (created when missing)")
    add.add_argument(
        "--night", help="the night's id (default: the UTC date its first record was written, plus its run ids)"
    )
    add.add_argument("--nightly", type=Path, help="the night's nightly --json: what its bisects named")
    hud = sub.add_parser("hud", help="write the HUD page")
    hud.add_argument("--db", type=Path, required=True, help="the history DB")
    hud.add_argument("-o", "--out", type=Path, default=Path("hud.html"), help="the page to write (default hud.html)")
    hud.add_argument(
        "--nights", type=_nights, default=14, help=f"nights shown as columns, 1 to {MAX_NIGHTS} (default 14)"
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        try:
            return add_main(args) if args.what == "add" else hud_main(args)
        except sqlite3.Error as exc:  # whatever query met it: one line, never a traceback
            raise db_error(args.db, exc) from None
    except (HistoryError, MatrixError, OSError) as exc:
        print(f"history {args.what}: {flat(exc)}", file=sys.stderr)
        return 2
